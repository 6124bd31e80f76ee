"""One offload tier's chunks (the host's DRAM, or the disk behind it): which chunk keys
it holds, which of them are readable, which are pinned by a transfer, and which goes
when room is needed.

Knows vLLM's CPUOffloadingManager bookkeeping (`vllm/v1/kv_offload/cpu/manager.py`,
`cpu/policies/lru.py` in v0.34): a chunk is allocated when its store is prepared (it
takes its room at once and is pinned until the write ends), becomes readable when the
write ends, is pinned while a load reads it, and only an idle chunk (readable, no pins)
may be evicted, least recently used first. A request's chunks are touched tail first, so
that inside one request the tail goes before the head (vLLM's LRU keeps one recency
rank per request and evicts its tails first). `arc` is taken as a policy name and
evicts as LRU (stated; its ghost lists are not modelled).

Records vLLM's offloading events as the prefix cache records the GPU's
(engine.sim.prefix_cache): `(BlockStored, [key], None, b"", None, medium, 0)` when a
chunk becomes readable and `(BlockRemoved, [key], medium)` when it is evicted, one event
per chunk (vLLM's default, non-self-describing payload). Does not know time, links or
requests (engine.sim.offload.manager).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from inference_lab.engine.sim.prefix_cache import REMOVED, STORED


@dataclass(slots=True)
class Chunk:
    ready: bool = False  # its bytes have arrived: a lookup hits it
    pins: int = 1  # transfers using it (its own write, from allocation until complete)
    from_disk: bool = False  # promoted from the disk tier and not loaded since


class ChunkTier:
    """One tier: at most `capacity` chunks by key, least recently used first."""

    def __init__(self, capacity: int, medium: str, events: list | None = None) -> None:
        self.capacity = capacity
        self.medium = medium  # vLLM's event medium: "CPU" or "STORAGE"
        self.chunks: OrderedDict[int, Chunk] = OrderedDict()
        self.pinned = 0  # chunks with pins > 0 (vLLM's *_usage_perc counts these)
        self.events = events  # shared with the manager; None: not recorded
        self.evicted = 0  # chunks evicted, ever

    def __len__(self) -> int:
        return len(self.chunks)

    def get(self, key: int) -> Chunk | None:
        return self.chunks.get(key)

    def touch(self, keys: list[int]) -> None:
        """A request used these chunks (head first in `keys`): most recent now, its
        tail before its head in eviction order."""
        chunks = self.chunks
        for key in reversed(keys):
            if key in chunks:
                chunks.move_to_end(key)

    def allocate(self, keys: list[int]) -> bool:
        """Room for these new chunks, pinned and not readable yet, evicting idle chunks
        least recently used first; False (nothing changed) when too few are idle."""
        chunks = self.chunks
        short = len(chunks) + len(keys) - self.capacity
        if short > 0:
            victims = []
            for key, chunk in chunks.items():
                if chunk.ready and not chunk.pins:
                    victims.append(key)
                    if len(victims) == short:
                        break
            if len(victims) < short:
                return False
            self._evict(victims)
        for key in reversed(keys):
            chunks[key] = Chunk()
        self.pinned += len(keys)
        return True

    def _evict(self, keys: list[int]) -> None:
        chunks, events = self.chunks, self.events
        for key in keys:
            del chunks[key]
            if events is not None:
                events.append((REMOVED, [key], self.medium))
        self.evicted += len(keys)

    def clear(self) -> int:
        """Evict every idle chunk (readable, no pins; vLLM's reset_cache of the offloading
        manager): chunks a store or load still uses stay. Returns how many went."""
        idle = [key for key, chunk in self.chunks.items() if chunk.ready and not chunk.pins]
        self._evict(idle)
        return len(idle)

    def complete(self, keys: list[int], from_disk: bool = False) -> None:
        """Their writes ended: readable, unpinned."""
        chunks, events = self.chunks, self.events
        for key in keys:
            chunk = chunks.get(key)
            if chunk is None:
                continue
            chunk.ready = True
            chunk.from_disk = from_disk
            self.unpin_one(chunk)
            if events is not None:
                events.append((STORED, [key], None, b"", None, self.medium, 0))

    def pin(self, keys: list[int]) -> None:
        chunks = self.chunks
        for key in keys:
            chunk = chunks[key]
            if not chunk.pins:
                self.pinned += 1
            chunk.pins += 1

    def unpin(self, keys: list[int]) -> None:
        chunks = self.chunks
        for key in keys:
            chunk = chunks.get(key)
            if chunk is not None:
                self.unpin_one(chunk)

    def unpin_one(self, chunk: Chunk) -> None:
        chunk.pins -= 1
        if not chunk.pins:
            self.pinned -= 1

    def usage(self) -> float:
        """Occupancy: chunks held (readable or being written) / capacity."""
        return len(self.chunks) / self.capacity if self.capacity else 0.0

    def pinned_usage(self) -> float:
        """vLLM's kv_offload_cpu_cache_usage_perc: chunks pinned by transfers / capacity."""
        return self.pinned / self.capacity if self.capacity else 0.0
