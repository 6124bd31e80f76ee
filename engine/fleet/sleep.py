"""Sleep mode as vLLM's `--enable-sleep-mode` has it: what a sleeping replica frees, and
what waking it costs.

Knows: the two levels (1: the KV cache discarded, the weights offloaded to host memory;
2: both discarded) and the memory tags a wake may restore one at a time ("weights",
"kv_cache"); that a wake restoring the weights costs their bytes over the host link
(`load_bandwidth` per GPU, the `tp` GPUs loading in parallel: from pinned host memory at
level 1, from the host's storage or page cache at level 2, which the lab prices alike),
while re-allocating the KV cache costs nothing worth modelling; and that the KV cache's
contents (the prefix cache) are gone either way.

Does not know: clocks, requests or the service (engine.fleet.runtime applies a wake's
cost to its core's clock); pure arithmetic.
"""

from __future__ import annotations

from inference_lab.engine.sim.catalog import weight_bytes
from inference_lab.engine.sim.specs import Deployment

LEVELS = (1, 2)
TAGS = ("weights", "kv_cache")  # vLLM's memory tags, in the order a wake restores them


def wake_seconds(deployment: Deployment, tags: set[str] | frozenset[str] = frozenset(TAGS)) -> float:
    """Modelled seconds to restore `tags`: the weights' bytes over the host link of `tp`
    GPUs loading in parallel (none when the weights are not among them)."""
    if "weights" not in tags:
        return 0.0
    return weight_bytes(deployment.model) / (deployment.hardware.load_bandwidth * deployment.tp)


def check_tags(tags: list[str]) -> set[str]:
    """The tags a wake names (ValueError for one vLLM does not know); none: all of them."""
    unknown = [t for t in tags if t not in TAGS]
    if unknown:
        raise ValueError(f"unknown tag {unknown[0]!r}: expected {' or '.join(map(repr, TAGS))}")
    return set(tags) if tags else set(TAGS)
