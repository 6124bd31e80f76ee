"""KV offloading of one replica, as vLLM v0.34's OffloadingConnector runs it: the host
tier (and an optional disk tier behind it), the copies between them and the GPU, and
what the scheduler asks of them.

Knows (vLLM's `offloading/scheduler.py`, `offloading/worker.py`, `cpu/spec.py`):
- capacity: a chunk is `blocks_per_chunk` GPU blocks; its bytes are one GPU block's KV
  bytes on every rank x the ranks x blocks_per_chunk, rounded up to 4096 (a page), and
  the host tier holds `cpu_bytes // chunk bytes` chunks;
- a chunk is keyed by the chained hash of its last GPU block (the prefix cache's
  64-bit hashes, which the GPU's KV events carry);
- stores: each step offers every full chunk of a scheduled request's prompt up to what
  the step computes (prompt blocks only: vLLM's `offload_prompt_only` default; at most
  its `max_offload_tokens`); chunks the tier holds are touched, the rest allocated
  (evicting idle chunks; when too few are idle the offer fails, is counted, and is made
  again next step); the copy is submitted at the start of the next step on the
  device-to-host FIFO and the chunk is readable when it ends;
- loads: at admission, after the GPU prefix cache's hit, the consecutive readable host
  chunks from there (whole chunks, at most the request's `max_load_tokens`); the
  request waits (vLLM's WAITING_FOR_REMOTE_KVS) while the host-to-device copy runs on
  its FIFO beside other requests' compute; a chunk still being written (or promoted
  from disk) defers the request to a later step;
- the disk tier (vLLM's TieringOffloadingSpec with an `fs` tier): every chunk stored to
  the host is written through to it; a disk hit is promoted into the host tier (the
  request deferred meanwhile), then loaded. Unlike vLLM's fs tier, it has a capacity and
  evicts least recently used (an external evictor's job in vLLM).
A transfer job takes fixed latency + its bytes on one rank / the link's bandwidth (each
rank moves its share over its own link, in parallel); one FIFO per direction.

Does not know the block pool, the waiting queue or metrics (engine.sim.scheduler asks
`lookup` / `start_load`, engine.sim.core calls `begin_step` and `offer` each step).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from inference_lab.engine.sim.offload.config import HOST_LINK_FALLBACK, OffloadConfig
from inference_lab.engine.sim.offload.tier import ChunkTier

PAGE = 4096
STORE, LOAD, PROMOTE, DISK_WRITE = 0, 1, 2, 3


@dataclass(slots=True)
class Fifo:
    """One direction of one link: a job starts when the previous one ended."""

    bandwidth: float  # bytes/s per rank
    latency: float  # seconds per job
    busy_until: float = 0.0

    def book(self, start: float, nbytes: float) -> tuple[float, float]:
        """(begin, end) of a job of `nbytes` per rank submitted at `start`."""
        begin = start if start > self.busy_until else self.busy_until
        end = begin + self.latency + nbytes / self.bandwidth
        self.busy_until = end
        return begin, end


@dataclass(slots=True)
class OffloadRequest:
    """A request's dealings with the offload tiers (vLLM's per-request connector state)."""

    max_load_tokens: int = -1  # kv_transfer_params.max_load_tokens (-1: no cap; 0: never load)
    max_offload_tokens: int = -1  # ... max_offload_tokens (-1: no cap; 0: never store)
    load_host: bool = True  # kv_transfer_params.kv_load_tiers names "CPU" (or is absent)
    load_disk: bool = True  # ... names "STORAGE" (or is absent)
    offered: int = 0  # chunks offered to the host tier so far (from the head)
    host_tokens: int = 0  # prompt tokens loaded from the host tier at its first scheduling
    disk_tokens: int = 0  # ... of which promoted from the disk tier for it
    queried: bool = False  # its prompt counted in the external queries


@dataclass(slots=True)
class OffloadStats:
    """Counters as vLLM's offloading metrics read them (bytes summed over the ranks,
    times over the ranks' copies)."""

    load_bytes: float = 0.0
    store_bytes: float = 0.0
    load_time: float = 0.0  # seconds, copy start to end, excluding the wait in the FIFO
    store_time: float = 0.0
    allocation_failures: int = 0
    host_tokens: int = 0  # prompt tokens loaded (vLLM's cached-by-source host)
    disk_tokens: int = 0  # ... of which promoted from disk first (by-source disk)
    load_sizes: list = field(default_factory=list)  # bytes per job since the last take
    store_sizes: list = field(default_factory=list)


class HostOffload:
    def __init__(self, config: OffloadConfig, block_size: int, rank_bytes_per_token: float,
                 tp: int = 1, host_link: tuple[float, float] = HOST_LINK_FALLBACK,
                 record_events: bool = False) -> None:
        """`rank_bytes_per_token`: KV bytes of one cached position on one GPU (the paged
        layers, engine.sim.kv.bytes_per_token); `host_link`: (bytes/s per GPU per
        direction, seconds per job), replaced by the config's when it gives one."""
        self.config = config
        self.block_size = block_size
        if config.chunk_tokens:
            if config.chunk_tokens % block_size:
                raise ValueError(f"the offload block_size ({config.chunk_tokens}) must be a "
                                 f"multiple of the GPU block size ({block_size})")
            self.bpc = config.chunk_tokens // block_size
        else:
            self.bpc = config.blocks_per_chunk
        self.tp = tp
        self.chunk_tokens = self.bpc * block_size
        self.rank_block_bytes = rank_bytes_per_token * block_size  # one GPU block, one rank
        raw = self.rank_block_bytes * tp * self.bpc
        self.chunk_bytes = -(-int(raw) // PAGE) * PAGE if raw else PAGE
        self.num_chunks = int(config.cpu_bytes // self.chunk_bytes)
        self.events: list | None = [] if record_events else None
        self.host = ChunkTier(self.num_chunks, "CPU", self.events)
        self.disk = (ChunkTier(int(config.disk_bytes // self.chunk_bytes), "STORAGE", self.events)
                     if config.disk_bytes else None)
        bandwidth, latency = host_link
        if config.host_bandwidth > 0:
            bandwidth = config.host_bandwidth
        if config.host_latency >= 0:
            latency = config.host_latency
        self.h2d = Fifo(bandwidth, latency)  # loads
        self.d2h = Fifo(bandwidth, latency)  # stores
        self.disk_read = Fifo(config.disk_bandwidth, config.disk_latency)
        self.disk_write = Fifo(config.disk_bandwidth, config.disk_latency)
        self.jobs: list[tuple[float, int, int, list[int]]] = []  # (end, seq, kind, keys), a heap
        self._seq = 0
        self.queued: list[list[int]] = []  # stores offered in the last step, to submit
        self.stats = OffloadStats()

    # ---- sizes --------------------------------------------------------------------------
    @property
    def cpu_tokens(self) -> int:
        return self.num_chunks * self.chunk_tokens

    def _job(self, end: float, kind: int, keys: list[int]) -> None:
        self._seq += 1
        heapq.heappush(self.jobs, (end, self._seq, kind, keys))

    def _copy(self, kind: int, keys: list[int], nbytes: float, now: float) -> float:
        """A store (GPU to host) or a load (host to GPU) of `nbytes` per rank submitted at
        `now` on its FIFO, counted as vLLM counts it (bytes and copy time summed over the
        ranks, the wait in the FIFO excluded): when it ends."""
        begin, end = (self.d2h if kind == STORE else self.h2d).book(now, nbytes)
        stats, total, seconds = self.stats, nbytes * self.tp, (end - begin) * self.tp
        if kind == STORE:
            stats.store_bytes += total
            stats.store_time += seconds
            stats.store_sizes.append(total)
        else:
            stats.load_bytes += total
            stats.load_time += seconds
            stats.load_sizes.append(total)
        self._job(end, kind, keys)
        return end

    def _key(self, hashes: list[int], chunk: int) -> int:
        return hashes[(chunk + 1) * self.bpc - 1]

    # ---- each step ------------------------------------------------------------------------
    def begin_step(self, now: float) -> None:
        """The step starting at `now`: transfers that ended by then take effect (chunks
        readable, pins released, write-through to disk), then the stores offered in the
        previous step are submitted."""
        jobs = self.jobs
        while jobs and jobs[0][0] <= now:
            end, _, kind, keys = heapq.heappop(jobs)
            if kind == STORE:
                self.host.complete(keys)
                if self.disk is not None:
                    self._write_through(keys, end)
            elif kind == LOAD:
                self.host.unpin(keys)
            elif kind == PROMOTE:
                self.host.complete(keys, from_disk=True)
                self.disk.unpin(keys)
            else:
                self.disk.complete(keys)
        if self.queued:
            for keys in self.queued:
                self._copy(STORE, keys, len(keys) * self.bpc * self.rank_block_bytes, now)
            self.queued = []

    def _write_through(self, keys: list[int], at: float) -> None:
        disk = self.disk
        new = [k for k in keys if k not in disk.chunks]
        if new and disk.allocate(new):
            _, end = self.disk_write.book(at, len(new) * self.bpc * self.rank_block_bytes)
            self._job(end, DISK_WRITE, new)

    def offer(self, chunks) -> None:
        """The step's scheduled (request, positions) pairs: the full prompt chunks each
        will have computed, not offered before, are stored (submitted next step)."""
        bs, bpc, host = self.block_size, self.bpc, self.host
        for req, n in chunks:
            state = req.offload
            if state is None or not state.max_offload_tokens:
                continue
            limit = req.num_computed + n
            if self.config.offload_prompt_only and limit > req.prompt_len:
                limit = req.prompt_len
            if 0 < state.max_offload_tokens < limit:
                limit = state.max_offload_tokens
            hashes = req.block_hashes
            blocks = min(limit // bs, len(hashes))
            end = blocks // bpc
            if end <= state.offered:
                continue
            keys = [hashes[(c + 1) * bpc - 1] for c in range(state.offered, end)]
            held = host.chunks
            new = [k for k in keys if k not in held]
            if len(new) < len(keys):
                host.touch([k for k in keys if k in held])
            if new:
                if not host.allocate(new):
                    self.stats.allocation_failures += 1
                    continue  # offered again next step
                self.queued.append(new)
            state.offered = end

    # ---- admission ------------------------------------------------------------------------
    def lookup(self, req, hit_blocks: int, limit_blocks: int, now: float) -> int:
        """GPU blocks beyond the GPU hit of `hit_blocks` that `req` can load from the host
        tier now (whole chunks, at most limit_blocks in all and its max_load_tokens), or
        -1: defer it (a chunk it needs is being written or promoted from disk; promotions
        of its disk hits are started here)."""
        state = req.offload
        if state is None or not state.max_load_tokens or not state.load_host:
            return 0
        hashes, bpc = req.block_hashes, self.bpc
        first = hit_blocks // bpc
        last = min(limit_blocks, len(hashes)) // bpc  # chunks [first, last) may load
        cap = state.max_load_tokens
        if cap > 0:
            last = min(last, (hit_blocks + cap // self.block_size) // bpc)
        host, disk = self.host.chunks, self.disk
        hits = 0
        promote: list[int] = []
        for c in range(first, last):
            key = hashes[(c + 1) * bpc - 1]
            chunk = host.get(key)
            if chunk is not None:
                if not chunk.ready:
                    return -1
                if promote:
                    break  # (loaded once the promotions before it end)
                hits += 1
                continue
            if disk is not None and state.load_disk:
                on_disk = disk.chunks.get(key)
                if on_disk is not None and on_disk.ready:
                    promote.append(key)
                    continue
            break
        if promote and self.host.allocate(promote):
            self.disk.pin(promote)
            nbytes = len(promote) * bpc * self.rank_block_bytes
            _, end = self.disk_read.book(now, nbytes)
            self._job(end, PROMOTE, promote)
            return -1
        if promote:
            self.stats.allocation_failures += 1
        if not hits:
            return 0
        return (first + hits) * bpc - hit_blocks

    def start_load(self, req, hit_blocks: int, blocks: int, now: float) -> float:
        """Load `blocks` GPU blocks of `req` after its GPU hit (a `lookup` result > 0),
        submitted at `now`: when the copy ends."""
        bpc = self.bpc
        hashes = req.block_hashes
        keys = [self._key(hashes, c) for c in range(hit_blocks // bpc, (hit_blocks + blocks) // bpc)]
        host = self.host
        host.pin(keys)
        host.touch(keys)
        disk_chunks = 0
        for key in keys:
            chunk = host.chunks[key]
            if chunk.from_disk:
                chunk.from_disk = False
                disk_chunks += 1
        end = self._copy(LOAD, keys, blocks * self.rank_block_bytes, now)
        state = req.offload
        state.offered = max(state.offered, (hit_blocks + blocks) // bpc)
        state.disk_tokens = disk_chunks * self.chunk_tokens
        return end

    def reset(self) -> int:
        """Forget every chunk no transfer uses, host and disk (vLLM's `reset_cache` of
        the offloading connector, reached by /reset_prefix_cache?reset_external=true):
        each evicted chunk is a BlockRemoved of its medium; chunks being written, loaded
        or promoted stay. Returns the chunks forgotten."""
        cleared = self.host.clear()
        if self.disk is not None:
            cleared += self.disk.clear()
        return cleared

    def take_events(self) -> list:
        events = self.events
        if not events:
            return []
        self.events = []
        self.host.events = self.events
        if self.disk is not None:
            self.disk.events = self.events
        return events
