"""Benchmark result files as measured closed-loop points.

Knows five formats, told apart by their content (not their names):
- CSV with the header `concurrency,input_len,output_len,ttft_ms,tpot_ms` (any order;
  optional `num_prompts` and `ttft_p50_ms`, the median TTFT): one point per line, mean
  lengths, TTFT and TPOT means in ms;
- `vllm bench serve --save-result` JSON (`max_concurrency`, `mean_ttft_ms`,
  `median_ttft_ms`, `mean_tpot_ms`, `total_input_tokens`, `completed`, ...);
- inference-perf lifecycle reports (`summary_lifecycle_metrics.json`,
  `stage_N_lifecycle_metrics.json`: `load_summary`, `successes.latency.*` in seconds);
- aiperf `profile_export_aiperf.json` (`time_to_first_token`, `inter_token_latency`,
  `input_sequence_length`, ... each {unit, avg, p50, ...}; the concurrency from its
  `input_config`), or its older `records` layout;
- guidellm reports (`benchmarks[*]`, each with its strategy and `metrics.*_ms.successful`).
TPOT means the time per output token after the first: vLLM's TPOT, aiperf's and
guidellm's inter-token latency, inference-perf's time_per_output_token. A file's TTFT
median is used when it has one (a benchmark's TTFT mean carries its opening burst and
queueing tails), else its mean. Only closed-loop runs are points: a run at a request
rate without a concurrency cap is refused, naming the file.
Files are read within inference_lab.common.reading's bounds (64 MiB a file, JSON as
deep as Python's parser takes, a CSV field of csv's limit); a point's concurrency is at
most MAX_CONCURRENCY clients (each one a simulated closed-loop user: more would run for
hours). Anything unreadable is a MeasurementError naming the file and the place.
Does not know deployments or the simulator (calibrate.simulate).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference_lab.common.reading import csv_rows, loads, read_text


class MeasurementError(ValueError):
    """A measurement file that cannot be read as closed-loop points: one line naming it."""


@dataclass(slots=True)
class Measurement:
    """One closed-loop run: `concurrency` clients, `num_prompts` requests in all (0 =
    not stated), mean prompt / output lengths, and metrics in ms (simulate.METRICS keys)."""

    where: str  # file, and line or benchmark, for messages
    concurrency: int
    input_len: int
    output_len: int
    metrics: dict[str, float] = field(default_factory=dict)
    num_prompts: int = 0


CSV_REQUIRED = ("concurrency", "input_len", "output_len", "ttft_ms", "tpot_ms")
CSV_OPTIONAL = ("num_prompts", "ttft_p50_ms")
MAX_CONCURRENCY = 4096  # a point's clients (simulated users) at most


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(value: Any, what: str, where: str, integer: bool = False) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise MeasurementError(f"{where}: {what}: expected a number, got {_short(value)}") from None
    if not math.isfinite(x) or x <= 0 or (integer and x != int(x)):
        kind = "a positive integer" if integer else "a positive number"
        raise MeasurementError(f"{where}: {what}: expected {kind}, got {_short(value)}")
    return x


def _point(where: str, concurrency: Any, input_len: Any, output_len: Any, num_prompts: Any,
           metrics: dict[str, Any]) -> Measurement:
    """A Measurement from raw values, each checked; metrics with a None value are dropped."""
    c = int(_number(concurrency, "concurrency", where, integer=True))
    if c > MAX_CONCURRENCY:
        raise MeasurementError(f"{where}: concurrency {c}: at most {MAX_CONCURRENCY} clients "
                               "(each is simulated)")
    isl = round(_number(input_len, "input length", where))
    osl = round(_number(output_len, "output length", where))
    if osl < 2:
        raise MeasurementError(f"{where}: output length {osl}: TPOT needs at least 2 output tokens")
    n = int(_number(num_prompts, "number of prompts", where, integer=True)) if num_prompts else 0
    out = {k: _number(v, k, where) for k, v in metrics.items() if v is not None}
    if "tpot_ms" not in out and "tpot_p50_ms" not in out or "ttft_ms" not in out and "ttft_p50_ms" not in out:
        raise MeasurementError(f"{where}: no TTFT and TPOT (time per output token) found")
    return Measurement(where, c, isl, osl, out, n)


def read_csv(path: Path, text: str) -> list[Measurement]:
    rows = list(csv_rows(csv.reader(text.splitlines()), path, MeasurementError))
    if not rows:
        raise MeasurementError(f"{path}: empty file")
    header = [h.strip() for h in rows[0]]
    missing = [h for h in CSV_REQUIRED if h not in header]
    if missing:
        raise MeasurementError(f"{path}: a CSV needs the header {','.join(CSV_REQUIRED)} "
                               f"(optional: {', '.join(CSV_OPTIONAL)}); missing: {', '.join(missing)}")
    unknown = [h for h in header if h not in CSV_REQUIRED + CSV_OPTIONAL]
    if unknown:
        raise MeasurementError(f"{path}: unknown CSV column(s) {', '.join(unknown)}; known: "
                               f"{', '.join(CSV_REQUIRED + CSV_OPTIONAL)}")
    out = []
    for line, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise MeasurementError(f"{path}:{line}: {len(row)} values for {len(header)} columns")
        cells = dict(zip(header, (c.strip() for c in row)))
        median = cells.get("ttft_p50_ms")
        metrics = {"ttft_p50_ms": median} if median else {"ttft_ms": cells["ttft_ms"]}
        metrics["tpot_ms"] = cells["tpot_ms"]
        out.append(_point(f"{path}:{line}", cells["concurrency"], cells["input_len"],
                          cells["output_len"], cells.get("num_prompts"), metrics))
    if not out:
        raise MeasurementError(f"{path}: a header but no rows")
    return out


def _vllm_bench(path: Path, d: dict) -> list[Measurement]:
    where = str(path)
    concurrency = d.get("max_concurrency")
    completed = d.get("completed") or d.get("num_prompts")
    if concurrency is None:
        if d.get("request_rate") not in ("inf", None):
            raise MeasurementError(f"{where}: an open-loop run (request rate {d.get('request_rate')}/s, "
                                   "no --max-concurrency): calibrate fits closed-loop runs")
        concurrency = completed  # every prompt sent at once: one burst of that many clients
    if not completed:
        raise MeasurementError(f"{where}: no completed requests")
    return [_point(where, concurrency, d["total_input_tokens"] / completed,
                   d["total_output_tokens"] / completed, d.get("num_prompts") or completed,
                   {"ttft_p50_ms": d.get("median_ttft_ms"),
                    "ttft_ms": None if d.get("median_ttft_ms") else d.get("mean_ttft_ms"),
                    "tpot_ms": d.get("mean_tpot_ms")})]


def _inference_perf(path: Path, d: dict) -> list[Measurement]:
    where = str(path)
    load, ok = d.get("load_summary") or {}, d.get("successes") or {}
    concurrency = load.get("concurrency")
    if concurrency is None:
        raise MeasurementError(f"{where}: no load_summary.concurrency: an open-loop stage (rate "
                               f"{load.get('requested_rate', '?')}/s); calibrate fits concurrency stages")
    lat = ok.get("latency") or {}
    ttft, tpot = lat.get("time_to_first_token") or {}, lat.get("time_per_output_token") or {}
    prompt = ok.get("prompt_tokens") or ok.get("prompt_len") or {}
    output = ok.get("output_tokens") or ok.get("output_len") or {}

    def ms(stats: dict, name: str, key: str) -> float | None:
        if stats.get(key) is None:
            return None
        return 1000.0 * _number(stats[key], f"successes.latency.{name}.{key}", where)

    return [_point(where, concurrency, prompt.get("mean"), output.get("mean"), ok.get("count"),
                   {"ttft_p50_ms": ms(ttft, "time_to_first_token", "median"),
                    "ttft_ms": None if ttft.get("median") is not None
                    else ms(ttft, "time_to_first_token", "mean"),
                    "tpot_ms": ms(tpot, "time_per_output_token", "mean")})]


_AIPERF_TAGS = {"ttft": "time_to_first_token", "itl": "inter_token_latency",
                "isl": "input_sequence_length", "osl": "output_sequence_length"}


def _find(tree: Any, key: str) -> Any:
    """The first value under `key` anywhere in nested dicts (breadth first)."""
    queue = [tree]
    while queue:
        node = queue.pop(0)
        if isinstance(node, dict):
            if node.get(key) is not None:
                return node[key]
            queue.extend(v for v in node.values() if isinstance(v, dict))
    return None


def _aiperf(path: Path, d: dict) -> list[Measurement]:
    where = str(path)
    recs = d.get("records") if isinstance(d.get("records"), dict) else d
    recs = {_AIPERF_TAGS.get(k, k): v for k, v in recs.items() if isinstance(v, dict)}

    def stat(tag: str, key: str) -> float | None:
        m = recs.get(tag) or {}
        value = m.get(key)
        if value is None:
            return None
        unit = m.get("unit", "ms")
        return _number(value, f"{tag}.{key}", where) * {"s": 1000.0, "sec": 1000.0, "ns": 1e-6, "us": 1e-3}.get(unit, 1.0)

    concurrency = _find(d.get("input_config") or {}, "concurrency")
    if concurrency is None:
        rate = _find(d.get("input_config") or {}, "request_rate")
        raise MeasurementError(f"{where}: no concurrency in input_config"
                               + (f" (request rate {rate}/s: an open-loop run)" if rate else "")
                               + "; calibrate fits closed-loop (--concurrency) runs")
    count = (recs.get("request_count") or {}).get("avg")
    return [_point(where, concurrency, (recs.get("input_sequence_length") or {}).get("avg"),
                   (recs.get("output_sequence_length") or {}).get("avg"), count,
                   {"ttft_p50_ms": stat("time_to_first_token", "p50"),
                    "ttft_ms": None if stat("time_to_first_token", "p50") else stat("time_to_first_token", "avg"),
                    "tpot_ms": stat("inter_token_latency", "avg")})]


def _guidellm(path: Path, d: dict) -> list[Measurement]:
    out = []
    for i, b in enumerate(d["benchmarks"]):
        where = f"{path}: benchmarks[{i}]"
        strategy = (b.get("config") or {}).get("strategy") or (b.get("args") or {}).get("strategy") or {}
        kind = strategy.get("type_") or strategy.get("type")
        if kind == "synchronous":
            concurrency = 1
        elif kind == "concurrent":
            concurrency = strategy.get("streams")
        else:
            raise MeasurementError(f"{where}: a {kind or 'unknown'} strategy: calibrate fits "
                                   "closed-loop (synchronous or concurrent) benchmarks")
        m = b.get("metrics") or {}

        def stat(name: str, key: str) -> float | None:
            return ((m.get(name) or {}).get("successful") or {}).get(key)

        totals = (b.get("run_stats") or b.get("scheduler_state") or {})
        count = (totals.get("requests_made") or {}).get("successful") if isinstance(totals.get("requests_made"), dict) else None
        out.append(_point(where, concurrency, stat("prompt_token_count", "mean"),
                          stat("output_token_count", "mean"), count,
                          {"ttft_p50_ms": stat("time_to_first_token_ms", "median"),
                           "ttft_ms": None if stat("time_to_first_token_ms", "median") else
                           stat("time_to_first_token_ms", "mean"),
                           "tpot_ms": stat("inter_token_latency_ms", "mean")}))
    return out


def read_file(path: Path) -> list[Measurement]:
    """The points of one file, whatever its format."""
    text = read_text(path, MeasurementError)
    if not text.lstrip().startswith(("{", "[")):
        return read_csv(path, text)
    d = loads(text, str(path), MeasurementError)
    try:
        if isinstance(d, dict) and isinstance(d.get("benchmarks"), list):
            return _guidellm(path, d)
        if isinstance(d, dict) and "mean_ttft_ms" in d:
            return _vllm_bench(path, d)
        if isinstance(d, dict) and "successes" in d and "load_summary" in d:
            return _inference_perf(path, d)
        if isinstance(d, dict) and ("time_to_first_token" in d or "records" in d):
            return _aiperf(path, d)
    except MeasurementError:
        raise
    except (KeyError, TypeError, AttributeError, ZeroDivisionError, ValueError,
            OverflowError) as exc:
        raise MeasurementError(f"{path}: a malformed result file ({type(exc).__name__}: {exc})") from None
    raise MeasurementError(f"{path}: not a format calibrate reads (CSV with {','.join(CSV_REQUIRED)}, "
                           "or the JSON of vllm bench serve --save-result, inference-perf, aiperf "
                           "or guidellm)")


def read_measurements(paths: list[Path]) -> list[Measurement]:
    out = []
    for path in paths:
        out.extend(read_file(Path(path)))
    return out
