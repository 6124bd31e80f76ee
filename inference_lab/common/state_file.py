"""A small JSON state file, written atomically, for live settings that must outlive a
process (`--state-dir`).

Knows: how to write a file so that a reader (or a process killed mid-write) sees either
the old contents or the new, never a mix: write a temporary file in the same directory,
flush and fsync it, `os.replace` it over the old one, fsync the directory. And how to read
one back, refusing (with the path) a file that is not a JSON object.

Does not know: what the settings mean (the engine keeps capacity, the gateway faults).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


class StateFileError(ValueError):
    """A state file that exists but cannot be used."""


def write_state(path: str | Path, data: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def read_state(path: str | Path) -> dict[str, Any] | None:
    """The saved object, or None when there is no file."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StateFileError(f"{path}: cannot read the saved state: {exc}") from None
    if not isinstance(data, dict):
        raise StateFileError(f"{path}: expected a JSON object")
    return data
