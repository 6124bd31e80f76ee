"""Reading the user's files with bounds: whatever a file holds, a reader ends in one error
line naming the file and the place (its line or field), never a traceback.

Knows the bounds a file reader of the lab keeps and what each refuses:
- a whole file read at once (a benchmark's result, a run's summary.json): MAX_FILE_BYTES
  at most, read as that many bytes and one more, so a device that never ends (/dev/zero)
  or a huge file costs that much and no more;
- a line of a file read line by line (a trace, a dataset): MAX_LINE_CHARS characters at most;
- JSON: what Python's parser takes, whose nesting depth its recursion limit bounds
  (1,000 levels by default): deeper is refused, as is an integer of more digits than
  Python converts (4,300 by default);
- CSV: a field of csv's own limit (131,072 characters).
Each refusal is raised as the caller's error type (a ValueError), with `where` first.

Does not know any format's fields (inference_lab.calibrate.measurements,
inference_lab.common.traces, inference_lab.common.dataset, the experiments' records).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

MAX_FILE_BYTES = 64 * 1024 * 1024  # one file read whole
MAX_LINE_CHARS = 16 * 1024 * 1024  # one line of a file read by lines


def read_text(path: Path, error: type[ValueError], limit: int = MAX_FILE_BYTES) -> str:
    """`path`'s text (UTF-8), at most `limit` bytes, else `error` naming the file."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise error(f"{path}: larger than {limit:,} bytes, the most this reader takes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start})") from None


def loads(text: str, where: str, error: type[ValueError]) -> Any:
    """`text` parsed as JSON, else `error` starting with `where` (a file, a file's line)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{where}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply for this reader") from None
    except ValueError as exc:  # an integer of too many digits, among others
        raise error(f"{where}: unreadable JSON ({exc})") from None


def lines(f: IO[str], path: Path | str, error: type[ValueError],
          limit: int = MAX_LINE_CHARS) -> Iterator[tuple[int, str]]:
    """(line number, line) of a text file open for reading; a line of more than `limit`
    characters is `error` naming the file and the line."""
    n = 0
    while True:
        line = f.readline(limit + 1)
        if not line:
            return
        n += 1
        if len(line) > limit and not line.endswith("\n"):
            raise error(f"{path}: line {n}: longer than {limit:,} characters, the most "
                        "this reader takes")
        yield n, line


def csv_rows(reader: Iterator[list[str]], path: Path | str,
             error: type[ValueError]) -> Iterator[list[str]]:
    """The rows of a csv.reader, its errors (a field over csv's field limit, a stray
    quote) as `error` naming the file and the line."""
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            line = getattr(reader, "line_num", None)
            raise error(f"{path}: line {line}: unreadable CSV ({exc})" if line
                        else f"{path}: unreadable CSV ({exc})") from None
        yield row
