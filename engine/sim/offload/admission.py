"""The scheduler's side of KV offloading: a waiting request whose prefix the host tier
holds loads it before it is scheduled (vLLM's WAITING_FOR_REMOTE_KVS).

Knows vLLM v0.34's order (`v1/core/sched/scheduler.py`): the GPU prefix cache's hit
first, then the connector's hit from there; with a hit, GPU blocks are allocated for
both at once, the request leaves the queue and computes nothing while its load runs,
then, in a step starting after the load ended, it is scheduled before the queue's head
(vLLM puts the requests it skipped back at the front) with every loaded token computed;
when the load covered the whole prompt its last token is computed again (it samples the
first token). A preempted request looks the host tier up again when it is readmitted.

Mixed into engine.sim.scheduler.Scheduler, which owns the block pool, the queue and the
admission rules (`_chunk`, `_take`, `_use_cached`, `_enter`, `_lora_blocked`). Does not
know the tiers' contents or the links (engine.sim.offload.manager).
"""

from __future__ import annotations

import heapq
from collections import deque

from inference_lab.engine.sim.request import Request, Status


class OffloadScheduling:
    def _start_offload(self) -> None:
        self.offload = None  # engine.sim.offload.HostOffload, when KV offloading is on
        self.loading: dict[int, Request] = {}  # waiting for their load (ended or not)
        self._loads: list[tuple[float, int]] = []  # (load's end, id), a heap
        self.loaded: deque[Request] = deque()  # loads ended, in order: admitted first

    def loads_ready_at(self) -> float | None:
        """When the first load in flight ends (now, for one already ended); None: none."""
        if self.loaded:
            return float("-inf")
        return self._loads[0][0] if self._loads else None

    def _loads_ended(self, now: float) -> None:
        loads, loading = self._loads, self.loading
        while loads and loads[0][0] <= now:
            req = loading.get(heapq.heappop(loads)[1])
            if req is not None:
                self.loaded.append(req)

    def _try_load(self, req: Request, hit: int, now: float) -> int:
        """At admission, after a GPU hit of `hit` blocks: 1 when `req` started a load and
        left the queue, 0 when it has none to load, -1 to defer it (a chunk being written
        or promoted), -2 when the GPU blocks for it are not free (KV full). A request
        pulling its prompt from a producer (P/D) loads nothing from the host: vLLM's
        MultiConnector loads from the first connector with a hit, NixlConnector first."""
        if req.external_tokens and req.first_scheduled < 0:
            return 0
        blocks = self.offload.lookup(req, hit, len(req.block_hashes), now)
        if blocks <= 0:
            return blocks
        bs = self.block_size
        total = req.prompt_len + req.num_output
        start = min((hit + blocks) * bs, total - 1)
        need = self.blocks_for(start) - hit
        revived = self.cache.count_free(req.block_hashes[:hit]) if hit else 0
        if need + revived > self.free_blocks:
            return -2
        self.waiting.pop()
        if self.cache is not None:
            self._use_cached(req, hit, revived)
        self._take(need)
        req.blocks += need
        loaded = start - hit * bs
        end = self.offload.start_load(req, hit, blocks, now)
        if req.first_scheduled < 0:  # (vLLM's num_cached_tokens: local and external)
            state = req.offload
            req.cached_tokens = start
            req.external_tokens = loaded
            self.transfers.external_hits += loaded
            state.host_tokens = loaded
            state.disk_tokens = min(state.disk_tokens, loaded)
            stats = self.offload.stats
            stats.host_tokens += loaded - state.disk_tokens
            stats.disk_tokens += state.disk_tokens
        req.num_computed = start
        self.loading[req.id] = req
        heapq.heappush(self._loads, (end, req.id))
        return 1

    def _admit_loaded(self, decision, budget: int, cap: int) -> tuple[int, bool]:
        """Schedule the requests whose loads ended, in order: (budget left, whether one
        could not be, which holds the queue behind it as vLLM's FCFS head does)."""
        loaded, loading = self.loaded, self.loading
        while loaded and budget > 0:
            req = loaded[0]
            if loading.get(req.id) is not req or req.status is not Status.WAITING:
                loaded.popleft()  # cancelled while loading
                continue
            siblings = req.n - 1 if req.family is None else 0
            if self.num_running + 1 + siblings > cap and (self.running or not siblings):
                return budget, True
            if req.lora is not None and self._lora_blocked(req):
                return budget, True
            n = self._chunk(req, budget)
            if n == 0:
                return budget, True
            need = self.blocks_for(req.num_computed + n) - req.blocks
            copies = siblings * self._sibling_blocks(req.prompt_len)
            if need + copies > self.free_blocks:
                return budget, True
            loaded.popleft()
            del loading[req.id]
            if req.first_scheduled < 0:
                self.transfers.external_queries += req.prompt_len
            self._enter(req, decision, n, need, copies, siblings)
            budget -= n
        return budget, False

    def _drop_load(self, req: Request) -> None:
        """A loading request ended (cancelled): its GPU blocks go back (the copy in
        flight runs to its end; its host chunks stay pinned until then)."""
        del self.loading[req.id]
        self._release(req)
