"""Faults on demand, for testing clients' resilience code: the gateway's side.

Modules:
- `directive`: the `x-inference-lab-fault` header (and a model's static `[fault]` mode),
  parsed and checked; eleven modes compatible with inference-lab (Rust), plus
  `after_tokens`.
- `stream`: how each mode is carried out on the wire (frames, FIN, RST, stall).
"""

from __future__ import annotations

from typing import Mapping

from inference_lab.gateway.faults.directive import HEADER, DirectiveError, FaultSpec, parse_header


def directive_for(header: str | None, stream: bool, model: str, enabled: bool,
                  static: Mapping[str, FaultSpec]) -> FaultSpec | None:
    """The fault a generation request gets: its header's (only when the server honours
    directives, and only on a streaming request), else its model's static `[fault]` mode
    (streaming requests only), else None. Raises DirectiveError, never ignores a header."""
    if header is not None:
        if not enabled:
            raise DirectiveError(f"{HEADER} is honoured only when the server runs with "
                                 "--enable-directives")
        if not stream:
            raise DirectiveError(f"{HEADER} applies to streaming requests only "
                                 '(send "stream": true)')
        return parse_header(header)
    return static.get(model) if stream else None


__all__ = ["HEADER", "DirectiveError", "FaultSpec", "directive_for", "parse_header"]
