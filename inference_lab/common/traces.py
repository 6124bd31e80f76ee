"""Production request traces, read for replay: each request's arrival time and lengths.

Knows three public formats, by the columns their publishers document:

- `mooncake` (kvcache-ai/Mooncake, `FAST25-release/traces/*.jsonl`): JSON Lines of
  `{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}`, where
  `timestamp` counts milliseconds from the trace's start and `hash_ids` names each
  512-token block of the prompt (ceil(input_length / 512) of them): equal ids are equal
  blocks, so prompts built from them share exactly the prefixes the trace's requests shared.
- `azure` (Azure/AzurePublicDataset, AzureLLMInferenceDataset2023 and 2024): CSV with the
  header `TIMESTAMP,ContextTokens,GeneratedTokens`; TIMESTAMP is a date and time
  (`2023-11-16 18:15:46.6805900`), counted here from the first row.
- `burstgpt` (HPMLL/BurstGPT, `data/BurstGPT_*.csv`): CSV with the header `Timestamp,
  Model,Request tokens,Response tokens,Total tokens,Log Type`; Timestamp counts seconds
  from the trace's start.

A trace is held as columns (arrays of numbers), a few bytes per request, so a day of
traffic fits in memory. Rows are replayed in time order (a stable sort: rows at one
instant keep the file's order). A row that generated nothing or had no prompt (BurstGPT
logs its failed requests with 0 response tokens) cannot be replayed as a request: it is
skipped and counted (`skipped`). Anything else that is not a request (a wrong type, a
missing field, a negative length, an unreadable time, the wrong number of hash ids) is a
TraceError naming the file and the line.

`window = (start, end)` keeps the requests at start <= t < end seconds of the trace and
starts the replay at `start`; `speed` divides every time (2 = twice as fast).

Does not know the engine, the clock or HTTP.
"""

from __future__ import annotations

import csv
import datetime
import hashlib
import math
import operator
import os
from array import array
from dataclasses import dataclass
from pathlib import Path

from inference_lab.common.reading import csv_rows, lines, loads

__all__ = ["FORMATS", "MOONCAKE_BLOCK", "Trace", "TraceError", "TraceRequest", "load_trace",
           "cached_trace", "block_tokens"]

FORMATS = ("mooncake", "azure", "burstgpt")
MOONCAKE_BLOCK = 512  # tokens per hash id (the trace's own block size)
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
MAX_TOKENS = 10_000_000  # a length past this is not a request's


class TraceError(ValueError):
    """A trace file that cannot be read, or a row that is not a request."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    t: float  # seconds from the replay's start
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...]  # mooncake: one per 512-token block; () otherwise
    line: int  # the row's line in the file


class Trace:
    """A trace's requests as columns, in time order."""

    def __init__(self, path: str, fmt: str) -> None:
        self.path, self.format = path, fmt
        self.times = array("d")  # seconds from the replay's start (after window and speed)
        self.inputs = array("q")
        self.outputs = array("q")
        self.lines = array("q")
        self.hash_at = array("q", [0])  # request i's hash ids: hashes[hash_at[i]:hash_at[i + 1]]
        self.hashes = array("q")
        self.skipped = 0  # rows that are not replayable requests (no output or no prompt)
        self.rows = 0  # rows read (requests and skipped ones)

    def __len__(self) -> int:
        return len(self.times)

    def __getitem__(self, i: int) -> TraceRequest:
        return TraceRequest(self.times[i], self.inputs[i], self.outputs[i],
                            tuple(self.hashes[self.hash_at[i]:self.hash_at[i + 1]]), self.lines[i])

    @property
    def duration(self) -> float:
        """Seconds from the replay's start to its last arrival."""
        return self.times[-1] if self.times else 0.0

    @property
    def has_blocks(self) -> bool:
        return len(self.hashes) > 0

    def prompt_ids(self, i: int, seed: int = 0) -> bytes:
        """Request i's prompt as packed uint32 token IDs built from its hash ids (b"" for a
        trace without them): block k is block_tokens(hash_ids[k]); the last one cut to the
        prompt's length."""
        a, b = self.hash_at[i], self.hash_at[i + 1]
        if a == b:
            return b""
        ids = b"".join(block_tokens(h, seed) for h in self.hashes[a:b])
        return ids[:4 * self.inputs[i]]

    def stats(self) -> dict:
        n = len(self)
        return {"requests": n, "skipped": self.skipped, "duration_s": self.duration,
                "mean_rate": n / self.duration if self.duration > 0 else None,
                "input_mean": sum(self.inputs) / n if n else None,
                "output_mean": sum(self.outputs) / n if n else None}


def block_tokens(hash_id: int, seed: int = 0) -> bytes:
    """The 512 token IDs (packed uint32) of a trace's hash id: the same bytes for the same id
    and seed, unrelated bytes for any other."""
    return hashlib.shake_128(b"%d:%d" % (seed, hash_id)).digest(4 * MOONCAKE_BLOCK)


def _count(value, what: str, where: str) -> int:
    """A token count: an integer >= 0 (a CSV's text or a JSON number)."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                raise TraceError(f"{where}: {what}: expected an integer >= 0, got {text!r}") from None
            if not number.is_integer():
                raise TraceError(f"{where}: {what}: expected an integer >= 0, got {text!r}")
            value = int(number)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKENS:
        raise TraceError(f"{where}: {what}: expected an integer in [0, {MAX_TOKENS}], got {value!r}")
    return value


def _seconds(value, what: str, where: str, scale: float = 1.0) -> float:
    """A relative time: a finite number >= 0 (text or JSON), times `scale`."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise TraceError(f"{where}: {what}: expected a number >= 0, got {value.strip()!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value >= 0):
        raise TraceError(f"{where}: {what}: expected a number >= 0, got {value!r}")
    return float(value) * scale


_days: dict[str, int] = {}


def _azure_time(text: str, where: str) -> tuple[int, float]:
    """(day number, seconds into the day, UTC) of `YYYY-MM-DD HH:MM:SS[.fraction][Z|+HH:MM]`
    (Azure's TIMESTAMP; up to 7 fractional digits, which datetime does not read). Apart, so
    that a difference keeps its tenths of a microsecond."""
    text = text.strip()
    try:
        date, _, clock = text.replace("T", " ", 1).partition(" ")
        day = _days.get(date)
        if day is None:
            day = _days[date] = datetime.date.fromisoformat(date).toordinal()
        offset = 0.0
        if clock.endswith("Z"):
            clock = clock[:-1]
        elif len(clock) > 6 and clock[-6] in "+-" and clock[-3] == ":":
            sign = 1 if clock[-6] == "-" else -1  # +02:00 is two hours ahead of UTC
            offset = sign * (int(clock[-5:-3]) * 3600 + int(clock[-2:]) * 60)
            clock = clock[:-6]
        h, m, s = clock.split(":")
        hours, minutes, seconds = int(h), int(m), float(s)
        if not (0 <= hours < 24 and 0 <= minutes < 60 and 0 <= seconds < 61):
            raise ValueError
    except (ValueError, IndexError):
        raise TraceError(f"{where}: TIMESTAMP: expected a date and time like "
                         f"2023-11-16 18:15:46.6805900, got {text!r}") from None
    return day, hours * 3600 + minutes * 60 + seconds + offset


def _rows_mooncake(f, path: str):
    for n, line in lines(f, path, TraceError):
        if not line.strip():
            continue
        where = f"{path}: line {n}"
        doc = loads(line, where, TraceError)
        if not isinstance(doc, dict):
            raise TraceError(f"{where}: expected an object with timestamp, input_length, "
                             "output_length, hash_ids")
        for key in ("timestamp", "input_length", "output_length"):
            if key not in doc:
                raise TraceError(f"{where}: {key}: missing")
        t = _seconds(doc["timestamp"], "timestamp", where, 1e-3)
        inp = _count(doc["input_length"], "input_length", where)
        out = _count(doc["output_length"], "output_length", where)
        ids = doc.get("hash_ids", [])
        if not isinstance(ids, list) or not all(
                isinstance(h, int) and not isinstance(h, bool) and 0 <= h < 2**63 for h in ids):
            raise TraceError(f"{where}: hash_ids: expected an array of integers >= 0")
        if ids and len(ids) != -(-inp // MOONCAKE_BLOCK):
            raise TraceError(f"{where}: hash_ids: {len(ids)} ids for {inp} input tokens; "
                             f"expected ceil({inp} / {MOONCAKE_BLOCK}) = {-(-inp // MOONCAKE_BLOCK)}")
        yield t, inp, out, ids, n


def _csv_rows(f, path: str, columns: tuple[str, ...]):
    """(line number, the named columns' values) per data row, after the header."""
    reader = csv.reader(f)
    rows = csv_rows(reader, path, TraceError)  # (a field over csv's limit: its line named)
    header = None
    for row in rows:
        if row and any(cell.strip() for cell in row):
            header = [cell.strip() for cell in row]
            break
    if header is None:
        raise TraceError(f"{path}: empty file (expected a header with {', '.join(columns)})")
    missing = [c for c in columns if c not in header]
    if missing:
        raise TraceError(f"{path}: line {reader.line_num}: the header lacks "
                         f"{', '.join(missing)} (got {', '.join(header)})")
    pick = operator.itemgetter(*[header.index(c) for c in columns])
    width = len(header)
    for row in rows:
        if not row or not row[0].strip() and not any(cell.strip() for cell in row):
            continue
        if len(row) != width:
            raise TraceError(f"{path}: line {reader.line_num}: {len(row)} fields; the header has {width}")
        yield reader.line_num, pick(row)


def _counts(inp: str, out: str, names: tuple[str, str], path: str, n: int) -> tuple[int, int]:
    """Two token counts of a CSV row: int() of the text (surrounding blanks and all) when it
    is one in range, else _count's reading and its error naming the line."""
    try:
        i, o = int(inp), int(out)
        if 0 <= i <= MAX_TOKENS and 0 <= o <= MAX_TOKENS:
            return i, o
    except ValueError:
        pass
    where = f"{path}: line {n}"
    return _count(inp, names[0], where), _count(out, names[1], where)


def _rows_azure(f, path: str):
    origin = None
    for n, (stamp, inp, out) in _csv_rows(f, path, AZURE_COLUMNS):
        day, t = _azure_time(stamp, f"{path}: line {n}")
        if origin is None:
            origin = (day, t)
        i, o = _counts(inp, out, ("ContextTokens", "GeneratedTokens"), path, n)
        yield (day - origin[0]) * 86400 + (t - origin[1]), i, o, (), n


def _rows_burstgpt(f, path: str):
    names = ("Request tokens", "Response tokens")
    for n, (stamp, inp, out) in _csv_rows(f, path, BURSTGPT_COLUMNS):
        try:
            t = float(stamp)
        except ValueError:
            t = -1.0
        if not 0 <= t < math.inf:  # the reading with its error message
            t = _seconds(stamp, "Timestamp", f"{path}: line {n}")
        i, o = _counts(inp, out, names, path, n)
        yield t, i, o, (), n


_READERS = {"mooncake": _rows_mooncake, "azure": _rows_azure, "burstgpt": _rows_burstgpt}


def load_trace(path: str | Path, fmt: str, *, speed: float = 1.0,
               window: tuple[float, float] | None = None, limit: int | None = None) -> Trace:
    """Every replayable request of the trace at `path` in format `fmt`, in time order.
    Raises TraceError naming the file (and the line) on anything unreadable."""
    if fmt not in _READERS:
        raise TraceError(f"{path}: unknown trace format {fmt!r} (one of {', '.join(FORMATS)})")
    if not speed > 0:
        raise TraceError(f"{path}: speed must be > 0, got {speed!r}")
    start, end = window if window is not None else (0.0, math.inf)
    rows = []
    trace = Trace(str(path), fmt)
    try:
        with open(path, encoding="utf-8", newline="") as f:
            read = skipped = 0
            for row in _READERS[fmt](f, str(path)):
                read += 1
                if not start <= row[0] < end:
                    continue
                if row[1] < 1 or row[2] < 1:
                    skipped += 1
                    continue
                rows.append(row)
            trace.rows, trace.skipped = read, skipped
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not UTF-8 text") from None
    except csv.Error as exc:
        raise TraceError(f"{path}: not CSV ({exc})") from None
    if not rows:
        return trace
    times = next(zip(*rows))
    if any(map(operator.gt, times, times[1:])):
        rows.sort(key=operator.itemgetter(0))
    if limit is not None:
        del rows[limit:]
    times, inputs, outputs, ids, lines = zip(*rows)
    origin = start if window is not None else 0.0
    trace.times = array("d", [(t - origin) / speed for t in times])
    trace.inputs, trace.outputs, trace.lines = array("q", inputs), array("q", outputs), array("q", lines)
    if any(ids):
        for row_ids in ids:
            trace.hashes.extend(row_ids)
            trace.hash_at.append(len(trace.hashes))
    else:
        trace.hash_at = array("q", bytes(8 * (len(rows) + 1)))
    return trace


_cache: dict[tuple, Trace] = {}


def cached_trace(path: str | Path, fmt: str, *, speed: float = 1.0,
                 window: tuple[float, float] | None = None) -> Trace:
    """load_trace, kept while the file is unchanged (one trace at a time: an experiment's
    runner, oracle and autoscalers read the same one)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    key = (str(path), fmt, speed, window, st.st_mtime_ns, st.st_size)
    trace = _cache.get(key)
    if trace is None:
        _cache.clear()
        trace = _cache[key] = load_trace(path, fmt, speed=speed, window=window)
    return trace
