"""A model's `[fault]` TOML table, read from the deployment configs by the gateway.

Knows: the table's keys, each checked with the file and key path on refusal (a bad table
stops the server at start, never a request):

    [fault]
    rate = 0.05                       # probability of an injected error per request
    types = ["rate_limit", "overloaded"]   # drawn from uniformly (default: every type)
    retry_after = 2                   # retry hints on 429 / 503 / 529 (all optional)
    retry_after_ms = 1500
    should_retry = true
    mode = "cut_mid_frame"            # optional static directive, as inference-lab's:
    after_chunks = 5                  #   every streaming request of the model gets it
    delay_ms = 10
    utf8 = true
    after_tokens = 100                # (this lab's) fire inside the real stream instead

The served name is the file's `name` key, else its stem, as the engine names it. The
engine ignores this table; everything else in the file is the engine's to check.

Does not know: how the settings are applied (gateway.faults.injection, .control, .stream).
"""

from __future__ import annotations

from pathlib import Path

from inference_lab.common.toml import ConfigError, Table, read_toml
from inference_lab.gateway.faults.directive import MODES, DirectiveError, FaultSpec, from_table
from inference_lab.gateway.faults.injection import TYPES, ErrorType, ModelFaults, RetryHints

KEYS = ("rate", "types", "retry_after", "retry_after_ms", "should_retry", "mode",
        "after_chunks", "after_tokens", "delay_ms", "utf8")
_U32 = 2**32 - 1


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.glob("*.toml") if p.is_file())
    raise ConfigError(str(path), "", "no such file or directory")


def _types_ok(value: list) -> bool:
    return bool(value) and all(isinstance(v, str) and v in TYPES for v in value)


def read_table(t: Table) -> tuple[ModelFaults, FaultSpec | None]:
    rate = t.get("rate", float, "a probability in [0, 1]", 0.0, ok=lambda v: 0 <= v <= 1)
    types = t.get("types", list, f"a non-empty list of error types ({', '.join(TYPES)})",
                  None, ok=_types_ok)
    hints = RetryHints(
        retry_after=t.get("retry_after", float, "seconds in [0, 86400]", None,
                          ok=lambda v: 0 <= v <= 86_400),
        retry_after_ms=t.get("retry_after_ms", int, "milliseconds in [0, 86400000]", None,
                             ok=lambda v: 0 <= v <= 86_400_000),
        should_retry=t.get("should_retry", bool, "true or false", None))
    directive = {
        "mode": t.get("mode", str, f"a fault mode ({', '.join(MODES)})", None),
        "after_chunks": t.get("after_chunks", int, f"an integer in 0..{_U32}", None,
                              ok=lambda v: 0 <= v <= _U32),
        "after_tokens": t.get("after_tokens", int, f"an integer in 1..{_U32}", None,
                              ok=lambda v: 1 <= v <= _U32),
        "delay_ms": t.get("delay_ms", int, "an integer in 0..3600000", None,
                          ok=lambda v: 0 <= v <= 3_600_000),
        "utf8": t.get("utf8", bool, "true or false", None),
    }
    t.done()
    settings = ModelFaults(rate=rate, hints=hints,
                           **({"types": tuple(ErrorType(v) for v in types)} if types else {}))
    spec = None
    if directive["mode"] is not None:
        try:
            spec = from_table(directive)
        except DirectiveError as exc:
            raise ConfigError(t.where, t.key("mode"), str(exc)) from None
    elif any(v is not None for v in directive.values()):
        raise ConfigError(t.where, t.key("mode"), "missing; after_chunks, after_tokens, "
                          "delay_ms and utf8 shape a static directive, which needs a mode")
    return settings, spec


def load_fault_tables(path: str | Path) -> tuple[dict[str, ModelFaults], dict[str, FaultSpec]]:
    """Every `[fault]` table of the configs at `path` (a directory of `*.toml`, or one
    file): (model -> injected-error settings, model -> static directive)."""
    settings: dict[str, ModelFaults] = {}
    static: dict[str, FaultSpec] = {}
    for file in _files(Path(path)):
        data = read_toml(file)
        if "fault" not in data:
            continue
        name = data.get("name") if isinstance(data.get("name"), str) and data["name"] \
            else file.stem
        model_faults, spec = read_table(Table(data["fault"], str(file), "fault", KEYS))
        settings[name] = model_faults
        if spec is not None:
            static[name] = spec
    return settings, static
