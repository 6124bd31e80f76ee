"""vLLM-v1-style continuous batching for one model: what runs in the next step.

Knows the waiting queue, the running set (in admission order), the KV block pool (a
counter of free blocks, of which the prefix cache's unreferenced blocks are a part,
evicted least-recently-freed first when memory is needed) and the token budget. One `schedule()` call is one iteration's decision, in
phases: schedule running requests (preempting by recompute under KV pressure), admit
waiting requests only if nothing was preempted, check the budget. `apply()` then books
the iteration's outcome. Does not know time, costs or drivers (engine.core does).

Simplification, stated: decodes are scheduled before partially prefilled running
requests (vLLM interleaves them in admission order); this only matters when the token
budget is smaller than the batch, which max_num_seqs <= max_num_batched_tokens excludes.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from inference_lab.engine.sim.decode_group import DecodeGroup
from inference_lab.engine.sim.kv import blocks_for
from inference_lab.engine.sim.kv_transfer import TransferStats
from inference_lab.engine.sim.offload.admission import OffloadScheduling
from inference_lab.engine.sim.prefix_cache import PrefixCache
from inference_lab.engine.sim.request import Family, Request, Status
from inference_lab.engine.sim.specs import SchedulerConfig


@dataclass(slots=True)
class Decision:
    """What one iteration computes: the whole decode group plus prefill chunks."""

    num_decodes: int  # group members, `decode_width` positions each
    chunks: list[tuple[Request, int]] = field(default_factory=list)  # (request, positions)
    admitted: list[Request] = field(default_factory=list)  # first scheduled this step
    preempted: list[Request] = field(default_factory=list)

    lora_load_seconds: float = 0.0  # adapters moved into GPU slots for this step
    decode_width: int = 1  # positions each decode computes: 1 + draft tokens to verify
    decode_advance: int = 1  # positions each decode keeps: 1 + accepted draft tokens

    @property
    def num_tokens(self) -> int:
        return self.num_decodes * self.decode_width + sum(n for _, n in self.chunks)


class WaitingQueue:
    """FCFS deque or priority heap; cancelled entries are skipped lazily, so `len`
    is kept exact separately."""

    def __init__(self, policy: str) -> None:
        self.priority = policy == "priority"
        self._deque: deque[Request] = deque()
        self._heap: list[tuple[int, float, int, Request]] = []
        self._seq = itertools.count()
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def push(self, req: Request, front: bool = False) -> None:
        self.count += 1
        if self.priority:
            heapq.heappush(self._heap, (req.priority, req.arrival, next(self._seq), req))
        elif front:
            self._deque.appendleft(req)
        else:
            self._deque.append(req)

    def peek(self) -> Request | None:
        if self.priority:
            heap = self._heap
            while heap and heap[0][3].status is not Status.WAITING:
                heapq.heappop(heap)
            return heap[0][3] if heap else None
        dq = self._deque
        while dq and dq[0].status is not Status.WAITING:
            dq.popleft()
        return dq[0] if dq else None

    def pop(self) -> Request:
        req = self.peek()
        assert req is not None
        if self.priority:
            heapq.heappop(self._heap)
        else:
            self._deque.popleft()
        self.count -= 1
        return req

    def requests(self) -> list[Request]:
        """The waiting requests (order not meant), for reports."""
        entries = (e[3] for e in self._heap) if self.priority else iter(self._deque)
        return [r for r in entries if r.status is Status.WAITING]

    def discard(self, req: Request) -> None:
        """The caller has already moved req out of WAITING; only the count changes."""
        self.count -= 1


class Scheduler(OffloadScheduling):
    def __init__(self, config: SchedulerConfig, total_blocks: int, windows: tuple[int, ...],
                 fixed_blocks: int = 0, record_kv_events: bool = False,
                 ids: Iterator[int] | None = None):
        self.config = config
        self.block_size = config.block_size
        self.fixed_blocks = fixed_blocks  # held by every running sequence (recurrent state)
        self.total_blocks = total_blocks
        self.free_blocks = total_blocks  # unheld blocks, the cache's evictable ones included
        self.cache = (PrefixCache(config.block_size, record_kv_events)
                      if config.enable_prefix_caching else None)
        self.reserved_places = 0  # running places held for siblings not spawned yet
        self.spawned: list[Request] = []  # siblings spawned since the caller last took them
        self._ids = ids if ids is not None else itertools.count(1)
        self.waiting = WaitingQueue(config.policy)
        self.running: dict[int, Request] = {}  # admission order
        self.prefilling: dict[int, Request] = {}  # running, not in the group
        self.group = DecodeGroup(config.block_size, windows)
        self.num_preemptions = 0
        self.loras = None  # the base model's LoraRegistry (engine.sim.lora), when it has adapters
        self.lora_running: dict[int, int] = {}  # adapter id -> running sequences using it
        self.group_loras: dict[object, int] = {}  # adapter -> decode group members using it
        self.connector = True  # a KV connector (NixlConnector's role) counts its stats
        # Waiting requests vLLM counts as deferred (its skipped waiting queue): those a
        # LoRA slot held back in the last admission pass, and those whose KV pull from a
        # prefill replica had not ended at the last step's start. The rest wait for room.
        self.lora_deferred: dict[int, Request] = {}
        self.pulling: dict[int, Request] = {}
        self._pulls: list[tuple[float, int]] = []  # (pull's end, id), a heap
        self.transfers = TransferStats()
        self._start_offload()  # KV offloading's loads (engine.sim.offload.admission)

    # ---- queries -------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.loading)

    @property
    def num_running(self) -> int:
        """Running places in use: sequences in the batch, and those held for siblings
        of a request still prefilling."""
        return len(self.running) + self.reserved_places

    @property
    def num_deferred(self) -> int:
        """Waiting requests deferred by a LoRA slot or a KV pull (vLLM's `deferred`)."""
        return len(self.lora_deferred) + len(self.pulling) + len(self.loading)

    def pull_pending(self, req: Request) -> None:
        """`req` waits until `req.ready` for its KV pull (engine.core's connector)."""
        self.pulling[req.id] = req
        heapq.heappush(self._pulls, (req.ready, req.id))

    def has_work(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0 or bool(self.loading)

    def blocks_for(self, positions: int) -> int:
        """Blocks a running sequence with `positions` cached positions holds."""
        return blocks_for(positions, self.block_size) + self.fixed_blocks

    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.total_blocks if self.total_blocks else 0.0

    # ---- the decision --------------------------------------------------------------
    def schedule(self, now: float, max_num_seqs: int, width: int = 1, advance: int = 1,
                 admit: bool = True) -> Decision:
        """The iteration starting at simulated time `now`: requests that arrive later
        (a driver catching up on a step that began in the past) wait for the next one.
        `max_num_seqs` is the live cap on running requests (EngineCore owns it). Each
        decode verifies `width` positions and keeps `advance` of them. With `admit` False
        no waiting request is admitted (EngineCore's promise that the queue stays full)."""
        decision = Decision(num_decodes=0, decode_width=width, decode_advance=advance)
        self._end_pulls(now)
        if self.loading:
            self._loads_ended(now)
        budget = self.config.max_num_batched_tokens
        budget -= self._schedule_decodes(decision)
        budget = self._schedule_prefilling(decision, budget)
        if admit and not decision.preempted:
            self._admit_waiting(decision, budget, now, max_num_seqs)
        assert decision.num_tokens <= self.config.max_num_batched_tokens
        return decision

    def _end_pulls(self, now: float) -> None:
        pulls = self._pulls
        while pulls and pulls[0][0] <= now:  # pulls ended: schedulable from now on
            self.pulling.pop(heapq.heappop(pulls)[1], None)

    def _schedule_decodes(self, decision: Decision) -> int:
        group = self.group
        advance = decision.decode_advance
        need = group.blocks_needed(advance)
        while need > self.free_blocks and group.n:
            self._preempt(self._victim(list(self.running.values())), decision)
            need = group.blocks_needed(advance)
        self._take(need)
        decision.num_decodes = group.n
        return group.n * decision.decode_width

    def _schedule_prefilling(self, decision: Decision, budget: int) -> int:
        pending = list(self.prefilling.values())
        for i, req in enumerate(pending):
            if budget <= 0:
                break
            if req.status is not Status.RUNNING:
                continue  # preempted earlier in this pass
            n = self._chunk(req, budget)
            if n == 0:
                continue
            need = self.blocks_for(req.num_computed + n) - req.blocks
            while need > self.free_blocks:
                # Victims come from what is not scheduled yet: req itself or later ones.
                rest = [r for r in pending[i:] if r.status is Status.RUNNING]
                victim = self._victim(rest)
                self._preempt(victim, decision)
                if victim is req:
                    break
            if req.status is not Status.RUNNING:
                continue
            self._take(need)
            req.blocks += need
            decision.chunks.append((req, n))
            if self.cache is not None and req.block_hashes:
                self._store_scheduled(req, req.num_computed + n)
            budget -= n
        return budget

    def _admit_waiting(self, decision: Decision, budget: int, now: float, cap: int) -> None:
        skipped: list[Request] = []  # waiting for a LoRA slot: later requests may go first
        if self.loaded:  # loads that ended go before the queue's head
            budget, held = self._admit_loaded(decision, budget, cap)
            if held:
                return
        while budget > 0:
            req = self.waiting.peek()
            if req is None or req.ready > now:
                break
            if req.lora is not None and self._lora_blocked(req):
                skipped.append(self.waiting.pop())
                continue
            siblings = req.n - 1 if req.family is None else 0  # places it needs beyond its own
            if self.num_running + 1 + siblings > cap and (self.running or not siblings):
                break  # (a request of more sequences than the cap runs alone)
            hit = self._cached_prefix(req)
            if self.offload is not None and req.offload is not None and not req.num_computed:
                loading = self._try_load(req, hit, now)
                if loading == -1:  # a chunk it needs is still in flight: a later step
                    skipped.append(self.waiting.pop())
                    continue
                if loading == -2:
                    break  # KV full
                if loading == 1:
                    continue  # waits for its load, out of the queue
            external = self._external(req, hit)
            start = hit * self.block_size + external
            n = self._chunk(req, budget, start)
            if n == 0:
                break
            need = self.blocks_for(start + n) - hit
            revived = self.cache.count_free(req.block_hashes[:hit]) if hit else 0
            copies = siblings * self._sibling_blocks(req.prompt_len)
            if need + revived + copies > self.free_blocks:
                break  # KV full: wait for blocks to free up, never preempt to admit
            if not self._fits(req, start):
                break  # the profile's admission rule (engine.sim.profiles)
            self.waiting.pop()
            if self.cache is not None:
                self._use_cached(req, hit, revived)
            if self.connector and req.first_scheduled < 0:
                self._use_external(req, start, external)
            self._enter(req, decision, n, need, copies, siblings)
            budget -= n
        for req in reversed(skipped):  # back at the head, in their order
            self.waiting.push(req, front=True)
        if skipped or self.lora_deferred:
            self.lora_deferred = {req.id: req for req in skipped}

    def _fits(self, req: Request, start: int) -> bool:
        """An engine profile's admission rule beyond KV room (vLLM's: none)."""
        return True

    def _enter(self, req: Request, decision: Decision, n: int, need: int, copies: int,
               siblings: int) -> None:
        """An admitted request joins the batch with a first chunk of n positions, taking
        `need` blocks of its own and `copies` for its siblings' last blocks."""
        req.status = Status.RUNNING
        self._take(need + copies)
        req.blocks += need
        req.pending_siblings, req.reserved_blocks = siblings, copies
        self.reserved_places += siblings
        self.running[req.id] = req
        self.prefilling[req.id] = req
        if req.lora is not None:
            self._lora_enter(req, decision)
        decision.admitted.append(req)
        decision.chunks.append((req, n))
        if self.cache is not None and req.block_hashes:
            self._store_scheduled(req, req.num_computed + n)

    # ---- LoRA slots: at most max_loras distinct adapters in the batch ------------------
    def _lora_blocked(self, req: Request) -> bool:
        return (req.lora.id not in self.lora_running
                and len(self.lora_running) >= self.loras.max_loras)

    def _lora_enter(self, req: Request, decision: Decision) -> None:
        adapter = req.lora
        running = self.lora_running
        if adapter.id not in running:
            decision.lora_load_seconds += self.loras.make_resident(adapter, set(running))
        running[adapter.id] = running.get(adapter.id, 0) + 1

    def _lora_leave(self, req: Request) -> None:
        running = self.lora_running
        count = running[req.lora.id] - 1
        if count:
            running[req.lora.id] = count
        else:
            del running[req.lora.id]

    def _chunk(self, req: Request, budget: int, cached: int = 0) -> int:
        """Positions of req's prefill that fit this step (0 = none), when the first
        `cached` of them come from the prefix cache."""
        remaining = req.prompt_len + req.num_output - (req.num_computed or cached)
        n = min(remaining, budget)
        threshold = self.config.long_prefill_token_threshold
        if threshold and n > threshold:
            n = threshold
        if n < remaining and not self.config.enable_chunked_prefill:
            return 0
        return n

    # ---- the block pool and the prefix cache ---------------------------------------------
    def _take(self, n: int) -> None:
        """Take n free blocks, evicting the least recently freed cached ones when the
        never-cached free blocks do not suffice."""
        cache = self.cache
        if cache is not None:
            short = n - (self.free_blocks - cache.num_evictable)
            if short > 0:
                cache.evict(short)
        self.free_blocks -= n

    def _cached_prefix(self, req: Request) -> int:
        """Leading full blocks of a waiting request found in the prefix cache. At least
        one position is always computed (it samples the next token), as in vLLM."""
        if self.cache is None or not req.block_hashes or req.num_computed:
            return 0
        limit = (req.prompt_len + req.num_output - 1) // self.block_size
        return self.cache.lookup(req.block_hashes, limit)

    def _use_cached(self, req: Request, hit: int, revived: int) -> None:
        """An admitted request starts from its cached prefix of `hit` blocks."""
        stats = self.cache.stats
        stats.queries += req.prompt_len
        if hit:
            self.cache.acquire(req.block_hashes[:hit])
            self.free_blocks -= revived
            req.blocks = req.cached_refs = hit
            req.num_computed = hit * self.block_size
            stats.hits += req.num_computed
        if req.first_scheduled < 0:
            req.cached_tokens = req.num_computed

    def _external(self, req: Request, hit: int) -> int:
        """Positions a request pulled from a producer adds beyond its local cache hit of
        `hit` blocks, on its first admission only (a preempted one recomputes: its pulled
        KV is gone). As vLLM's scheduler does, the last prompt position is computed here,
        whatever came: it samples the first token."""
        if not req.external_tokens or req.num_computed or req.first_scheduled >= 0:
            return 0
        usable = min(req.external_tokens, req.prompt_len + req.num_output - 1)
        return max(usable - hit * self.block_size, 0)

    def _use_external(self, req: Request, start: int, external: int) -> None:
        """A first admission with a connector: its prompt counted as queried, what it
        pulled as hit (vLLM's external prefix cache stats), and it starts from both."""
        stats = self.transfers
        stats.external_queries += req.prompt_len
        stats.external_hits += external
        req.external_tokens = external
        if external:
            req.num_computed = start
            req.cached_tokens = start  # (vLLM's num_cached_tokens: local and external)

    def hold_blocks(self, n: int) -> int:
        """Take up to n free blocks for KV held outside the batch (a handoff): how many."""
        n = min(n, self.free_blocks)
        self._take(n)
        return n

    def _store_scheduled(self, req: Request, positions: int) -> None:
        """Register with the cache the prompt blocks req will have computed at `positions`:
        as vLLM v1 does when it allocates a step's slots, before the step runs (each layer
        writes the whole batch's KV before its attention reads it), so a request scheduled
        after it, in this step or a later one, finds them."""
        hashes = req.block_hashes
        full = min(min(positions, req.prompt_len) // self.block_size, len(hashes))
        if full <= req.cached_refs:
            return
        dup, revived = self.cache.store(hashes, req.cached_refs, full, req.token_bytes,
                                        req.lora.id if req.lora is not None else None)
        self.free_blocks += dup - revived  # req's copies of resident blocks are freed
        req.cached_refs = full  # req.blocks (logical) is unchanged

    # ---- preemption and removal ------------------------------------------------------
    def _victim(self, candidates: list[Request]) -> Request:
        """FCFS: the most recently admitted candidate (candidates are in admission
        order). Priority: the worst (highest priority value, latest arrival)."""
        if self.waiting.priority:
            return max(candidates, key=lambda r: (r.priority, r.arrival))
        return candidates[-1]

    def _preempt(self, req: Request, decision: Decision) -> None:
        """Recompute preemption: the victim loses its KV, keeps its tokens and goes to
        the front of the waiting queue."""
        self._release(req)
        req.num_computed = 0
        req.status = Status.WAITING
        req.preemptions += 1
        self.num_preemptions += 1
        self.waiting.push(req, front=True)
        decision.preempted.append(req)

    def _release(self, req: Request) -> None:
        """Take a running request out of the batch and free its blocks (and its share of
        its family's prompt blocks, and what it held for siblings not spawned yet)."""
        if req.in_group:
            self.group.remove(req)
            req.blocks = self.blocks_for(req.num_computed) - req.shared_blocks
            if req.lora is not None:
                self.group_loras[req.lora] -= 1
        if req.lora is not None:
            self._lora_leave(req)
        if req.cached_refs:
            shared = req.cached_refs
            self.free_blocks += req.blocks - shared + self.cache.release(req.block_hashes[:shared])
            req.cached_refs = 0
        else:
            self.free_blocks += req.blocks
        self.free_blocks += req.reserved_blocks
        req.blocks = req.reserved_blocks = 0
        self.reserved_places -= req.pending_siblings
        req.pending_siblings = 0
        if req.shared_blocks:
            req.shared_blocks = 0
            family = req.family
            family.holders -= 1
            if family.holders == 0:
                self.free_blocks += family.shared_blocks
        self.running.pop(req.id, None)
        self.prefilling.pop(req.id, None)

    # ---- parallel sampling ---------------------------------------------------------
    def _sibling_blocks(self, prompt_len: int) -> int:
        """Blocks each sibling holds of its own when spawned: its copy of the prompt's
        partly filled last block, and its fixed per-sequence state."""
        return self.blocks_for(prompt_len) - prompt_len // self.block_size

    def _spawn(self, parent: Request) -> list[Request]:
        """The parent's prefill is complete: its n - 1 siblings take the places and blocks
        held for them, and every member shares the prompt's full blocks: through the
        prefix cache when the parent's are there (each sibling references them, as vLLM's
        child requests do), else held once for the family."""
        full = parent.prompt_len // self.block_size
        own = self._sibling_blocks(parent.prompt_len)
        cached = parent.cached_refs  # leading full blocks in the cache (0: none or no cache)
        family = Family(0 if cached else full, holders=parent.n, members=[parent])
        parent.family = family
        if not cached:
            parent.shared_blocks = full
            parent.blocks -= full
        self.free_blocks += parent.reserved_blocks - own * parent.pending_siblings
        self.reserved_places -= parent.pending_siblings
        parent.pending_siblings = parent.reserved_blocks = 0
        for index in range(1, parent.n):
            sibling = Request(next(self._ids), parent.prompt_len, parent.max_tokens,
                              parent.arrival, parent.priority, Status.RUNNING,
                              num_computed=parent.prompt_len, blocks=own,
                              first_scheduled=parent.first_scheduled, n=parent.n, index=index,
                              family=family, shared_blocks=0 if cached else full,
                              block_hashes=parent.block_hashes, token_bytes=parent.token_bytes,
                              cached_tokens=parent.cached_tokens, lora=parent.lora, eos=parent.eos)
            if parent.lora is not None:
                self.lora_running[parent.lora.id] += 1
            if cached:
                self.cache.acquire(parent.block_hashes[:cached])
                sibling.cached_refs = cached
                sibling.blocks = own + cached  # (logical: its cached references included)
                if cached < full:  # the rest of the full blocks: copies of its own
                    self._take(full - cached)
                    sibling.blocks += full - cached
            family.members.append(sibling)
            self.running[sibling.id] = sibling
        return family.members[1:]

    def finish(self, req: Request, status: Status) -> None:
        """End a request wherever it is (running, waiting or already final)."""
        if req.finished:
            return
        if req.status is Status.WAITING and req.id in self.loading:
            self._drop_load(req)
        elif req.status is Status.WAITING:
            self.waiting.discard(req)
            self.lora_deferred.pop(req.id, None)
            self.pulling.pop(req.id, None)
        else:
            self._release(req)
        req.status = status

    # ---- booking one iteration -----------------------------------------------------
    def apply(self, decision: Decision) -> tuple[list[Request], list[Request], int]:
        """Advance state by the decided iteration. Returns (requests that sampled their
        first token, requests that reached max_tokens, tokens sampled). Finished
        requests are released here; their status is set by the caller."""
        group = self.group
        done, sampled = group.advance(decision.decode_advance) if decision.num_decodes else ([], 0)
        for req in done:
            self._release(req)
        first: list[Request] = []
        for req, n in decision.chunks:  # (their blocks were cached when scheduled)
            req.num_computed += n
            if req.num_computed < req.prompt_len + req.num_output:
                continue  # prefill not complete yet
            self.prefilling.pop(req.id)
            sequences = [req]
            if req.family is None and req.n > 1:
                sequences += self._spawn(req)
                self.spawned.extend(sequences[1:])
            for seq in sequences:  # each samples a token from the computed context
                sampled += 1
                if seq.num_output == 0:
                    first.append(seq)
                seq.num_output += 1
                if seq.num_output >= seq.max_tokens:
                    self._release(seq)
                    done.append(seq)
                else:
                    group.add(seq)
                    if seq.lora is not None:
                        self.group_loras[seq.lora] = self.group_loras.get(seq.lora, 0) + 1
        return first, done, sampled
