"""Automatic prefix caching, as vLLM v1 does it: KV blocks addressed by their content.

Knows block hashes and which hashed blocks are resident: a full block of `block_size`
prompt tokens is named by a hash of its tokens chained to its parent block's hash (and an
optional extra key, such as a LoRA adapter's name, mixed into every block), so equal
hashes mean equal prefixes. Resident blocks are referenced by the running requests that
use them; a block nobody references stays cached, in least-recently-freed order, until
the scheduler needs its memory and evicts it. Optionally records what changed, as vLLM's
KV-cache events (BlockStored / BlockRemoved / AllBlocksCleared), for a publisher to send.

Does not know the scheduler's free-block count or requests: the scheduler calls
`lookup` / `acquire` when it admits, `store` as it schedules the prefill that fills blocks, `release`
when a request leaves the batch, and `evict` when it needs memory.

Simplifications, stated: only prompt blocks are hashed (generated tokens are placeholder
text the simulation never sees); and a block computed by two requests at once is kept
once (the second copy is freed at once instead of being cached twice).
"""

from __future__ import annotations

import hashlib
import random
from collections import deque
from dataclasses import dataclass

# Event kinds recorded by PrefixCache (the tuples' first item).
STORED = "BlockStored"
REMOVED = "BlockRemoved"
CLEARED = "AllBlocksCleared"


def block_hashes(token_bytes: bytes, block_size: int, extra: bytes = b"") -> list[int]:
    """The chained 64-bit hashes of every full block of a prompt given as packed
    little-endian uint32 token IDs: hash_i = first 8 bytes of
    sha256(hash_{i-1} (8 bytes, absent for the first block) + extra + tokens of block i),
    read big-endian."""
    step = block_size * 4
    end = len(token_bytes) // step * step
    out: list[int] = []
    parent = b""
    sha = hashlib.sha256
    for i in range(0, end, step):
        parent = sha(parent + extra + token_bytes[i:i + step]).digest()[:8]
        out.append(int.from_bytes(parent, "big"))
    return out


@dataclass(slots=True)
class PrefixCacheStats:
    """Counters in tokens, as vLLM's vllm:prefix_cache_queries / _hits."""

    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of which found cached


class BlockResidency:
    """Sampled KV block residency, as vLLM's `--kv-cache-metrics` keeps it
    (`vllm/v1/core/kv_cache_metrics.py`): a block is sampled when it is stored, with
    probability `sample`; each hit on it is an access (the last 4 kept); its eviction
    yields (lifetime: stored to evicted, idle: last access to evicted, the gaps between
    the kept accesses). Times are the simulated start of the step (`now`, set by the core)."""

    __slots__ = ("sample", "now", "blocks", "evicted", "_random")

    def __init__(self, sample: float, seed: int = 0) -> None:
        self.sample = sample
        self.now = 0.0
        self.blocks: dict[int, tuple[float, deque]] = {}  # hash -> (stored at, accesses)
        self.evicted: list[tuple[float, float, list[float]]] = []  # since the last take()
        self._random = random.Random(seed)

    def stored(self, hashes, indexes) -> None:
        sample, draw = self.sample, self._random.random
        for i in indexes:
            if sample >= 1.0 or draw() < sample:
                self.blocks[hashes[i]] = (self.now, deque(maxlen=4))

    def accessed(self, hashes) -> None:
        blocks, now = self.blocks, self.now
        for h in hashes:
            block = blocks.get(h)
            if block is not None:
                block[1].append(now)

    def gone(self, hashes) -> None:
        blocks, now = self.blocks, self.now
        for h in hashes:
            block = blocks.pop(h, None)
            if block is not None:
                born, seen = block
                gaps = [b - a for a, b in zip(seen, list(seen)[1:])]
                self.evicted.append((now - born, now - (seen[-1] if seen else born), gaps))

    def take(self) -> list[tuple[float, float, list[float]]]:
        evicted, self.evicted = self.evicted, []
        return evicted


class PrefixCache:
    def __init__(self, block_size: int, record_events: bool = False) -> None:
        self.block_size = block_size
        self.residency: BlockResidency | None = None  # --kv-cache-metrics
        self.refs: dict[int, int] = {}  # resident block hash -> running requests using it
        self.free: dict[int, None] = {}  # hashes with refs 0, least recently freed first
        self.stats = PrefixCacheStats()
        self.record_events = record_events
        self.events: list[tuple] = []  # (kind, ...) since the last take_events()

    # ---- queries ----------------------------------------------------------------------
    @property
    def num_evictable(self) -> int:
        """Cached blocks nobody references: free memory that still holds a prefix."""
        return len(self.free)

    def __len__(self) -> int:
        return len(self.refs)

    def lookup(self, hashes: list[int], max_blocks: int) -> int:
        """How many leading blocks of `hashes` (at most max_blocks) are resident."""
        refs = self.refs
        n = 0
        limit = min(len(hashes), max_blocks)
        while n < limit and hashes[n] in refs:
            n += 1
        return n

    def count_free(self, hashes: list[int]) -> int:
        """How many of these resident blocks nobody references (acquiring them takes
        that many blocks out of the free pool)."""
        free = self.free
        return sum(1 for h in hashes if h in free)

    # ---- changes ----------------------------------------------------------------------
    def acquire(self, hashes: list[int]) -> None:
        """A request starts using these resident blocks."""
        refs, free = self.refs, self.free
        for h in hashes:
            if refs[h] == 0:
                del free[h]
            refs[h] += 1
        if self.residency is not None:
            self.residency.accessed(hashes)

    def store(self, hashes: list[int], start: int, stop: int, token_bytes: bytes | None,
              lora_id: int | None = None) -> tuple[int, int]:
        """A request has computed its blocks hashes[start:stop] and now references them.
        Returns (duplicates, revived): how many were already resident (the request's
        copies go back to the pool) and, of those, how many nobody referenced (they
        leave the free pool)."""
        refs, free = self.refs, self.free
        dup = revived = 0
        new: list[int] = []
        for i in range(start, stop):
            h = hashes[i]
            count = refs.get(h)
            if count is None:
                refs[h] = 1
                new.append(i)
                continue
            dup += 1
            if count == 0:
                del free[h]
                revived += 1
            refs[h] = count + 1
        if new and self.record_events:
            self._stored(hashes, new, token_bytes, lora_id)
        residency = self.residency
        if residency is not None:  # the new blocks are not sampled yet: only hits count
            if dup:
                residency.accessed(hashes[start:stop])
            residency.stored(hashes, new)
        return dup, revived

    def _stored(self, hashes: list[int], new: list[int], token_bytes: bytes | None,
                lora_id: int | None) -> None:
        """One BlockStored per run of consecutive new blocks, with its parent's hash."""
        bs4 = self.block_size * 4
        run = [new[0]]
        for i in new[1:] + [-1]:
            if i == run[-1] + 1:
                run.append(i)
                continue
            a, b = run[0], run[-1] + 1
            tokens = token_bytes[a * bs4:b * bs4] if token_bytes else b""
            self.events.append((STORED, hashes[a:b], hashes[a - 1] if a else None, tokens,
                                lora_id))
            run = [i]

    def release(self, hashes: list[int]) -> int:
        """A request stops using these blocks. Returns how many nobody uses any more
        (they become free but stay cached); the last block is queued for eviction first,
        as vLLM frees a request's blocks tail first."""
        refs, free = self.refs, self.free
        freed = 0
        for h in reversed(hashes):
            count = refs[h] - 1
            refs[h] = count
            if count == 0:
                free[h] = None
                freed += 1
        return freed

    def evict(self, n: int) -> None:
        """Forget the n least recently freed cached blocks (n <= num_evictable)."""
        if n <= 0:
            return
        refs, free = self.refs, self.free
        gone = []
        it = iter(free)
        for _ in range(n):
            gone.append(next(it))
        for h in gone:
            del free[h]
            del refs[h]
        if self.residency is not None:
            self.residency.gone(gone)
        if self.record_events:
            self.events.append((REMOVED, gone))

    def clear(self) -> None:
        """Forget every block nobody references (vLLM's reset_prefix_cache): recorded
        as AllBlocksCleared when nothing is left, else as their BlockRemoved."""
        gone = list(self.free)
        for h in gone:
            del self.refs[h]
        self.free.clear()
        if self.residency is not None:  # a reset forgets its samples unobserved (as vLLM)
            for h in gone:
                self.residency.blocks.pop(h, None)
        if self.record_events:
            self.events.append((CLEARED,) if not self.refs else (REMOVED, gone))

    def take_events(self) -> list[tuple]:
        events, self.events = self.events, []
        return events
