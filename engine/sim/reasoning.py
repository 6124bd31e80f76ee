"""A model preset's `[reasoning]` table: a reasoning model, as vLLM's reasoning parsers see it.

Knows the keys (`parser`: the vLLM reasoning parser of the model, for display; `share`:
the fraction of a reply's tokens that are reasoning when a request says nothing) and
refuses bad values through `inference_lab.common.toml` with the key path. Returns a
`sim.specs.Reasoning`.

Does not know how a reply is split or shown: the engine tells each admitted request how
many of its first tokens are reasoning (engine.service.rpc), the gateway renders them.
"""

from __future__ import annotations

from inference_lab.common.toml import Table
from inference_lab.engine.sim.specs import Reasoning

KEYS = ("parser", "share")


def parse_reasoning(t: Table) -> Reasoning:
    parser = t.get("parser", str, "a non-empty string (vLLM's reasoning parser)", ok=bool)
    share = t.get("share", float, "a number in [0, 1]", 0.5, ok=lambda v: 0 <= v <= 1)
    t.done()
    return Reasoning(parser, share)


def reasoning_tokens(share: float, length: int) -> int:
    """How many of a reply's `length` tokens come first as reasoning."""
    return min(length, max(0, round(share * length)))
