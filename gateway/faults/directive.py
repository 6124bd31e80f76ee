"""Per-request fault directives: the `x-inference-lab-fault` header, parsed and checked.

Knows: the header's grammar, compatible with inference-lab (Rust)'s
`<mode>[;after_chunks=N][;delay_ms=N][;utf8=bool]`, the eleven mode names, and this lab's
extra key `after_tokens=N` (the fault fires after N *simulated* tokens of a real paced
stream instead of after N placeholder frames); the same fields as a model's static
`[fault]` TOML table (`mode = ...`). Every refusal is a DirectiveError whose message lists
what is valid, so a typo in a test fails loudly instead of passing against a normal stream.

Does not know: HTTP, aiohttp or how a mode is carried out (gateway.faults.stream).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Mapping

HEADER = "x-inference-lab-fault"
DEFAULT_AFTER_CHUNKS = 3
DEFAULT_DELAY_MS = 10
_MAX_U32 = 2**32 - 1
_MAX_DELAY_MS = 3_600_000  # an hour between frames is a stall; refuse more


class FaultMode(enum.StrEnum):
    CUT_BETWEEN_FRAMES = "cut_between_frames"  # FIN on a frame boundary, no chunk terminator
    CUT_MID_FRAME = "cut_mid_frame"  # half a frame (or one byte into "é"), then FIN
    RESET = "reset"  # TCP RST (SO_LINGER 0) instead of FIN
    STALL = "stall"  # nothing more, connection held open until the client leaves
    ERROR_ENVELOPE_200 = "error_envelope_200"  # OpenRouter-style error frame, then [DONE]
    ERROR_400_IN_SSE = "error_400_in_sse"  # vLLM-style 400 object in-stream, clean close
    NO_DONE = "no_done"  # finish (and usage) frames, clean close, no [DONE]
    NO_USAGE = "no_usage"  # finish frame and [DONE], the requested usage never comes
    CANCELLED_499 = "cancelled_499"  # dynamo's cancellation body, clean close
    MID_REASONING = "mid_reasoning"  # reasoning_content deltas, then cut between frames
    MID_TOOL_CALL = "mid_tool_call"  # a tool call whose arguments never close, then cut


MODES = tuple(m.value for m in FaultMode)
KEYS = ("after_chunks", "after_tokens", "delay_ms", "utf8")
# Modes that end the connection without the chunked terminator (curl exit 18, or 56 for reset).
ABRUPT = frozenset({FaultMode.CUT_BETWEEN_FRAMES, FaultMode.CUT_MID_FRAME, FaultMode.RESET,
                    FaultMode.MID_REASONING, FaultMode.MID_TOOL_CALL})


class DirectiveError(ValueError):
    """A directive that cannot be honoured; the message says what is valid."""


@dataclass(frozen=True, slots=True)
class FaultSpec:
    mode: FaultMode
    after_chunks: int = DEFAULT_AFTER_CHUNKS  # placeholder content frames before the fault
    delay_ms: int = DEFAULT_DELAY_MS  # fixed pause between placeholder frames
    utf8: bool = False  # cut_mid_frame only: cut inside a two-byte character
    after_tokens: int | None = None  # fire after N simulated tokens of the real stream

    def describe(self) -> str:
        parts = [self.mode.value]
        if self.after_tokens is not None:
            parts.append(f"after_tokens={self.after_tokens}")
        else:
            parts += [f"after_chunks={self.after_chunks}", f"delay_ms={self.delay_ms}"]
        if self.utf8:
            parts.append("utf8=true")
        return ";".join(parts)


def _valid() -> str:
    return (f"expected <mode>[;after_chunks=N][;after_tokens=N][;delay_ms=N][;utf8=true|false] "
            f"with mode one of: {', '.join(MODES)}")


def _mode(text: str) -> FaultMode:
    try:
        return FaultMode(text)
    except ValueError:
        raise DirectiveError(f"unknown fault mode {text!r}; {_valid()}") from None


def _count(key: str, text: str, upper: int) -> int:
    text = text.strip()
    if not text.isascii() or not text.isdigit() or int(text) > upper:
        raise DirectiveError(f"{key} must be an integer in 0..{upper}, got {text!r}; {_valid()}")
    return int(text)


def _bool(key: str, text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise DirectiveError(f"{key} must be true or false, got {text!r}; {_valid()}")
    return value == "true"


def _build(mode: FaultMode, fields: dict[str, Any]) -> FaultSpec:
    spec = FaultSpec(mode, **fields)
    if spec.utf8 and mode is not FaultMode.CUT_MID_FRAME:
        raise DirectiveError(f"utf8=true only applies to cut_mid_frame (got mode {mode.value!r})")
    if spec.after_tokens is not None and spec.after_tokens < 1:
        raise DirectiveError("after_tokens must be at least 1 (the fault fires after that many "
                             "simulated tokens)")
    if spec.after_tokens is not None and ("after_chunks" in fields or "delay_ms" in fields):
        raise DirectiveError("after_tokens paces the stream by the simulated engine: it cannot "
                             "be combined with after_chunks or delay_ms")
    return spec


def parse_header(value: str) -> FaultSpec:
    """`<mode>[;key=value]...`; whitespace around parts and values is ignored."""
    parts = [p.strip() for p in value.split(";")]
    if not parts[0]:
        raise DirectiveError(f"empty fault directive; {_valid()}")
    mode = _mode(parts[0])
    fields: dict[str, Any] = {}
    for part in parts[1:]:
        if not part:
            continue
        key, eq, val = part.partition("=")
        key = key.strip()
        if not eq:
            raise DirectiveError(f"expected key=value, got {part!r}; {_valid()}")
        if key in fields:
            raise DirectiveError(f"{key} is given twice")
        if key == "after_chunks":
            fields[key] = _count(key, val, _MAX_U32)
        elif key == "after_tokens":
            fields[key] = _count(key, val, _MAX_U32)
        elif key == "delay_ms":
            fields[key] = _count(key, val, _MAX_DELAY_MS)
        elif key == "utf8":
            fields[key] = _bool(key, val)
        else:
            raise DirectiveError(f"unknown fault parameter {key!r} (known: {', '.join(KEYS)}); "
                                 f"{_valid()}")
    return _build(mode, fields)


def from_table(table: Mapping[str, Any]) -> FaultSpec:
    """A static directive from a `[fault]` table's `mode`, `after_chunks`, `after_tokens`,
    `delay_ms` and `utf8` keys (already type-checked by the caller)."""
    fields = {k: table[k] for k in KEYS if table.get(k) is not None}
    return _build(_mode(str(table["mode"])), fields)
