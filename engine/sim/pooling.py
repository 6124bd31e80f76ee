"""A model preset's `[pooling]` table: what a pooling model returns instead of tokens.

Knows the keys vLLM reads from a pooling model's config (`task`: embed or score, the
vector's `dimensions`, `normalize`, `matryoshka` / `matryoshka_dimensions` as vLLM's
`is_matryoshka` and `matryoshka_dimensions`, `pooling_type`, `bidirectional` for an
encoder) and refuses bad values through `inference_lab.common.toml` with the key path.
Returns a `sim.specs.Pooling`.

Does not know what a pooling request costs (engine.sim.core: its prefill, nothing
generated) nor the vectors themselves (the gateway makes them).
"""

from __future__ import annotations

from inference_lab.common.toml import Table
from inference_lab.engine.sim.specs import POOLING_TASKS, Pooling

KEYS = ("task", "dimensions", "normalize", "matryoshka", "matryoshka_dimensions",
        "pooling_type", "bidirectional")
POOLING_TYPES = ("CLS", "LAST", "MEAN")


def parse_pooling(t: Table, hidden_dim: int) -> Pooling:
    """The `[pooling]` table of a model preset whose hidden size is `hidden_dim` (an
    embed model's `dimensions` default; a score model's output is 1 value)."""
    task = t.get("task", str, " or ".join(repr(k) for k in POOLING_TASKS),
                 ok=lambda v: v in POOLING_TASKS)
    dimensions = t.get("dimensions", int, "an integer >= 1", hidden_dim if task == "embed" else 1,
                       ok=lambda v: v >= 1)
    normalize = t.get("normalize", bool, "true or false", task == "embed")
    dims = t.get("matryoshka_dimensions", list,
                 f"a list of integers in [1, {dimensions}]", [],
                 ok=lambda v: all(type(d) is int and 1 <= d <= dimensions for d in v))
    matryoshka = t.get("matryoshka", bool, "true or false", bool(dims))
    pooling_type = t.get("pooling_type", str, " or ".join(repr(p) for p in POOLING_TYPES),
                         "LAST", ok=lambda v: v in POOLING_TYPES)
    bidirectional = t.get("bidirectional", bool, "true or false", False)
    t.done()
    if dims and not matryoshka:
        raise t.error("matryoshka", "true when matryoshka_dimensions is given", matryoshka)
    return Pooling(task, dimensions, normalize, matryoshka, tuple(sorted(set(dims))),
                   pooling_type, bidirectional)
