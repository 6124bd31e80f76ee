"""Reading TOML input with errors that name the file and the key path.

Knows: `ConfigError` (one line: `<file>: <key.path>: <what was wrong>`), the `Table` reader
with typed getters that refuse unknown keys, and `read_toml`. Shared by the engine's
configs and presets, the workloads and the experiment scenarios. Knows nothing of what
the tables mean.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["ConfigError", "Table", "REQUIRED", "read_toml"]


class ConfigError(ValueError):
    """Input refused at load. str() is one line: `<file>: <key.path>: <what was wrong>`."""

    def __init__(self, where: str, path: str, message: str) -> None:
        self.where, self.path, self.message = where, path, message
        super().__init__(": ".join(part for part in (where, path, message) if part))


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_kind(kind: type, value: Any) -> bool:
    if isinstance(value, bool):  # bool is an int subclass in Python, never in a config
        return kind is bool
    if kind is float:
        return isinstance(value, (int, float)) and math.isfinite(value)
    return isinstance(value, kind)


REQUIRED: Any = object()  # default of a getter: the key must be present


class Table:
    """One TOML table being read: typed getters naming the key path on refusal; `done()`
    then refuses any key that no getter asked for."""

    def __init__(self, data: Any, where: str, path: str = "", keys: tuple[str, ...] = ()) -> None:
        if not isinstance(data, dict):
            raise ConfigError(where, path, f"expected a table, got {_short_repr(data)}")
        self.data, self.where, self.path = data, where, path
        self._known: list[str] = []
        if keys:  # checked first, so that a misspelt key is not reported as a missing one
            self.refuse_unknown(keys)

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def error(self, name: str, what: str, got: Any) -> ConfigError:
        return ConfigError(self.where, self.key(name), f"expected {what}, got {_short_repr(got)}")

    def get(self, name: str, kind: type, what: str, default: Any = REQUIRED,
            ok: Callable[[Any], bool] | None = None) -> Any:
        """The value of `name` if it is a `kind` passing `ok`; `default` when absent
        (absent without a default is refused). Numbers read as float come back float."""
        self._known.append(name)
        if name not in self.data:
            if default is REQUIRED:
                raise ConfigError(self.where, self.key(name), f"missing; expected {what}")
            return default
        value = self.data[name]
        if not _is_kind(kind, value) or (ok is not None and not ok(value)):
            raise self.error(name, what, value)
        return float(value) if kind is float else value

    def table(self, name: str, default: Any = REQUIRED, keys: tuple[str, ...] = ()) -> Table | Any:
        self._known.append(name)
        if name not in self.data:
            if default is REQUIRED:
                raise ConfigError(self.where, self.key(name), "missing; expected a table")
            return default
        return Table(self.data[name], self.where, self.key(name), keys)

    def tables(self, name: str, keys: tuple[str, ...] = ()) -> list[Table]:
        """An array of tables (`[[name]]`), at least one."""
        self._known.append(name)
        items = self.data.get(name)
        if not isinstance(items, list) or not items:
            what = f"one or more [[{self.key(name)}]] tables"
            if name not in self.data:
                raise ConfigError(self.where, self.key(name), f"missing; expected {what}")
            raise self.error(name, what, items)
        return [Table(item, self.where, f"{self.key(name)}[{i}]", keys) for i, item in enumerate(items)]

    def refuse_unknown(self, known: Any) -> None:
        """Refuse any key not in `known`."""
        for name in self.data:
            if name not in known:
                listed = ", ".join(dict.fromkeys(known))
                raise ConfigError(self.where, self.key(name), f"unknown key (known keys: {listed})")

    def done(self) -> None:
        """Refuse any key that no getter asked for."""
        self.refuse_unknown(self._known)


def read_toml(path: str | Path) -> dict[str, Any]:
    """The parsed file; a missing file or a TOML syntax error is a ConfigError naming it."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise ConfigError(str(path), "", f"cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), "", f"invalid TOML: {exc}") from None
