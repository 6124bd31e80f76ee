"""A deployment config's `[memory]` tiers (inference-lab's layout) as KV offloading's host
and disk tiers.

Knows inference-lab's format (doublewordai/inference-lab `docs/src/reference/config.md`
@ 24d4011273fd1be1413a38f262ae40353f2d5541, "[memory]" and the hardware's `[memory]`
stores): a deployment names the hardware's stores that hold KV evicted from HBM,
closest first (`tiers`), and may cap each at some bytes per instance
(`[memory.capacity]`); a store's `capacity` is in bytes per instance, an instance being
one GPU's (`per = "gpu"`), one node's, shared by its GPUs (`per = "node"`), or the
topology's (`per = "cluster"`). Here a host-memory store (a name with `dram` or `lpddr`:
host_dram, grace_dram) becomes the host tier (vLLM's `--kv-offloading-size`) and an NVMe
store (a name with `nvme`, `ssd` or `disk`) the disk tier behind it
(`--kv-offloading-disk-size`), sized as this replica's share of the store: a per-GPU
store times the replica's GPUs, a node's store divided among the replicas on the node.

Does not know the links, the write / eviction / prefetch policies or a store shared
between replicas (the lab's tiers are each replica's own, written through and evicted
LRU: vLLM's): those are listed as parsed, not modelled.
"""

from __future__ import annotations

import math

from inference_lab.engine.sim.offload.config import OffloadConfig
from inference_lab.engine.sim.specs import Hardware

HOST_WORDS = ("dram", "lpddr")
DISK_WORDS = ("nvme", "ssd", "disk")


def kind_of(name: str) -> str:
    """"host", "disk" or "" (a store offloading does not model: peer HBM, ...)."""
    low = name.lower()
    if any(w in low for w in HOST_WORDS):
        return "host"
    if any(w in low for w in DISK_WORDS):
        return "disk"
    return ""


def replica_share(per: str, nbytes: float, tp: int, gpus_per_node: int) -> float:
    """A replica of `tp` GPUs' bytes of a store of `nbytes` per instance: a GPU's store
    pooled over its GPUs; a node's divided among the replicas the node holds (a replica
    wider than a node pools the nodes it spans); a cluster's store is not per replica (0)."""
    if per == "gpu":
        return nbytes * tp
    if per == "node":
        per_node = max(gpus_per_node, 1)
        return nbytes * math.ceil(tp / per_node) / max(per_node // tp, 1)
    return 0.0


def offload_from_tiers(tiers: list[str], caps: dict[str, float], hardware: Hardware,
                       tp: int) -> tuple[OffloadConfig | None, list[str]]:
    """The offloading the tiers turn on (None: none) and what of them is not modelled."""
    stores = {name: (per, nbytes) for name, per, nbytes in hardware.store_capacities}
    per_node = hardware.store_gpus_per_node or hardware.gpus_per_node or 1
    sizes: dict[str, tuple[str, float]] = {}  # kind -> (store, bytes)
    notes = []
    for name in tiers:
        kind = kind_of(name)
        per, nbytes = stores.get(name, ("", 0.0))
        if name in caps:
            nbytes = min(nbytes, caps[name]) if nbytes else caps[name]
        share = replica_share(per, nbytes, tp, per_node)
        if not kind or kind in sizes or share <= 0:
            why = ("a second " + kind + " tier" if kind in sizes else
                   "no capacity" if kind and per != "cluster" else
                   "shared by every replica" if per == "cluster" else "not a host or disk store")
            notes.append(f"memory tier {name} ({why}): parsed, not modelled")
            continue
        sizes[kind] = (name, share)
    if "disk" in sizes and "host" not in sizes:  # (vLLM's tiering needs its CPU tier)
        notes.append(f"memory tier {sizes.pop('disk')[0]} (a disk tier needs a host tier "
                     "before it): parsed, not modelled")
    if "host" not in sizes:
        return None, notes
    disk = sizes["disk"][1] if "disk" in sizes else 0.0
    return OffloadConfig(sizes["host"][1], disk_bytes=disk), notes
