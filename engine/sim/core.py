"""EngineCore: one model's simulated engine, a state machine told the time by its driver.

Knows the scheduler, the cost model and the admission rule (the waiting bound). Does
not know the wall clock, asyncio, gRPC or HTTP: the offline runner and the real-time
pacer drive it by calling `submit`, `step(now)` and `cancel` with simulated times.
A step is decided and booked when it starts; its tokens belong to its end time, which
the driver honours (the pacer delivers them then). Its P/D disaggregation half (a
replica's KV role, handoffs and pulls) is `KvConnector` (connector.py).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from inference_lab.engine.sim.capacity import Capacity, CapacityError
from inference_lab.engine.sim.connector import KvConnector
from inference_lab.engine.sim.cost import CostModel, attention_load, rate_for
from inference_lab.engine.sim.speculative import draft_seconds
from inference_lab.engine.sim.kv import bytes_per_token, fixed_blocks, total_blocks
from inference_lab.engine.sim.kv_transfer import HandoffsFull, KvTransfer
from inference_lab.engine.sim.lengths import OutputLength
from inference_lab.engine.sim.lora import MAX_ADAPTERS, LoraAdapter, LoraRegistry
from inference_lab.engine.sim.offload import HostOffload, host_link, offload_request
from inference_lab.engine.sim.prefix_cache import BlockResidency, block_hashes
from inference_lab.engine.sim.request import Request, Status
from inference_lab.engine.sim.profiles import make_scheduler, profile_of
from inference_lab.engine.sim.specs import Deployment

__all__ = ["CapacityError", "EngineCore", "HandoffsFull", "QueueSaturated", "StepResult",
           "SubmitError"]


class SubmitError(ValueError):
    """A request that can never run (too long for the model or the KV cache)."""


class QueueSaturated(Exception):
    """The waiting queue holds max_waiting requests: refuse, immediately. Its text is
    the one refusal message (the gateway relays it, never re-writes it)."""

    def __init__(self, model: str, waiting: int, max_waiting: int, text: str = "") -> None:
        self.model = model
        self.waiting = waiting
        self.max_waiting = max_waiting
        super().__init__(text or (
            f"Server is at capacity: {waiting} requests waiting (max_waiting = {max_waiting}). "
            "Retry with reduced concurrency."
        ))


@dataclass(slots=True)
class StepResult:
    """One iteration: its time span, what it did, and the stats the service exports."""

    start: float
    end: float
    num_tokens: int  # positions computed (0: nothing could run)
    sampled: int  # tokens generated in this step
    prefill_tokens: int  # prompt positions computed in this step
    num_decodes: int  # requests that decoded one token each (their previous came at `start`)
    admitted: list[Request] = field(default_factory=list)  # first scheduled now
    first_token: list[Request] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    spawned: list[Request] = field(default_factory=list)  # siblings (n > 1) that began now
    compute_seconds: float = 0.0  # of the step's time, what its FLOPs take at peak rates
    memory_seconds: float = 0.0  # ... and its bytes at peak bandwidth
    # its work per GPU by the cost model (StepCost; the draft model's is not counted)
    flops: float = 0.0
    read_bytes: float = 0.0
    write_bytes: float = 0.0
    # speculative decoding (vLLM's SpecDecodingStats): each decode proposed one draft of
    # `draft_tokens // drafts` tokens and kept its first `accepted_per_draft`
    drafts: int = 0
    draft_tokens: int = 0
    accepted_per_draft: int = 0


class EngineCore(KvConnector):
    def __init__(self, deployment: Deployment, lengths: OutputLength | None = None, *,
                 record_kv_events: bool = False, kv_cache_metrics_sample: float = 0.0,
                 mfu_metrics: bool = False) -> None:
        """`kv_cache_metrics_sample` > 0 (vLLM's --kv-cache-metrics with its
        --kv-cache-metrics-sample): that share of prefix-cached blocks has its residency
        kept (engine.sim.prefix_cache.BlockResidency). `mfu_metrics` (vLLM's
        --enable-mfu-metrics): the service exports each step's FLOPs and bytes."""
        self.deployment = deployment
        self.name = deployment.name
        config = deployment.scheduler
        self.cost = CostModel(deployment)
        self.total_blocks = total_blocks(deployment)
        self.block_size = config.block_size
        self.max_model_len = config.max_model_len or deployment.model.max_seq_len
        self.lengths = lengths or OutputLength()
        # The one live capacity (the deployment keeps what it was configured with).
        self.capacity = Capacity(0, 0).changed(config.max_num_batched_tokens,
                                               config.max_num_seqs, config.max_waiting)
        self._ids = itertools.count(1)
        self.profile = profile_of(config)  # the engine imitated (engine.sim.profiles)
        self.scheduler = make_scheduler(config, self.total_blocks, self.cost.windows,
                                   fixed_blocks(deployment), record_kv_events, ids=self._ids)
        self.max_request_tokens = min(limit for limit, _ in self._request_limits())
        self.speculative = deployment.speculative
        if self.speculative is not None:
            self.scheduler.group.max_advance = 1 + self.speculative.gamma
        self._accepted = 0.0  # expected positions not yet kept (fractional carry)
        self.prefix_cache = self.scheduler.cache  # None when prefix caching is off
        self.kv_residency = None  # sampled block residency, when asked for and cached
        if kv_cache_metrics_sample > 0 and self.prefix_cache is not None:
            self.kv_residency = BlockResidency(min(kv_cache_metrics_sample, 1.0))
            self.prefix_cache.residency = self.kv_residency
        self.record_kv_events = record_kv_events
        self.mfu_metrics = mfu_metrics
        self.clock = 0.0  # simulated time at which the engine is next free
        # The queue's bound is judged as of the last step boundary plus the arrivals since
        # (as vLLM's engine core takes aborts between steps): a place freed in the queue by
        # a hang-up, or a raised max_waiting, counts from the next step's start. So a full
        # queue stays full until then, which is what lets a client refuse on the engine's
        # word (QueueState's span). Both are forgotten when the engine has no work left.
        # A driver may promise that a full queue stays full until a later instant (`promise`):
        # then no step starting before it admits from the queue, and those places and bounds
        # wait for the first step starting at or after it.
        self._freed = 0  # queue places freed since the last such step began
        self._bound = 0  # the lowest max_waiting (> 0) in force since then; 0 = the live one
        self.admit_after = 0.0  # (sim time) no admission from the queue before this
        self.slowdown = 1.0  # step times x this (a throttled replica); 1 = as modelled
        # Generation paused (vLLM's PAUSED_NEW): no step admits from the queue, so an
        # engine with only waiting requests has no work; running ones step on.
        self.paused = False
        self._start_connector()
        # KV offloading to the host (and disk) tier: one per replica (engine.sim.offload)
        self.offload: HostOffload | None = None
        if deployment.offload is not None:
            self.offload = HostOffload(deployment.offload, self.block_size,
                                       bytes_per_token(deployment), deployment.tp,
                                       host_link(deployment.hardware), record_kv_events)
            self.scheduler.offload = self.offload
        # The cheapest step there is: one token attending one position (the weights read once).
        self._shortest_step = self.cost.step_cost(1, attention_load(self.cost.caps, [(1, 0)])).seconds

    # ---- queries ---------------------------------------------------------------------
    @property
    def max_num_seqs(self) -> int:
        return self.capacity.max_num_seqs

    @property
    def max_waiting(self) -> int:
        return self.capacity.max_waiting

    def saturation(self) -> QueueSaturated | None:
        """The refusal a new arrival would get now, or None when it would be queued: the
        waiting requests, and the places freed since the last step began, against the
        lowest bound in force since then."""
        waiting = self.scheduler.num_waiting
        bound = self.capacity.max_waiting
        if self._freed or self._bound:
            if self.scheduler.has_work():
                waiting += self._freed
                if self._bound and (not bound or self._bound < bound):
                    bound = self._bound
            else:  # an idle engine takes a hang-up or a new bound at once
                self._freed = self._bound = 0
        if 0 < bound <= waiting:
            return QueueSaturated(self.name, waiting, bound, self.profile.refusal_message)
        return None

    @property
    def num_waiting(self) -> int:
        """The depth compared with max_waiting. Arrivals enter the queue synchronously
        in `submit`, so accepted-but-not-stepped arrivals are already counted here."""
        return self.scheduler.num_waiting

    @property
    def num_deferred(self) -> int:
        """Of `num_waiting`, those held back by a LoRA slot or a KV pull (vLLM's
        `deferred` reason; the others wait for capacity: a running place, KV blocks,
        the token budget, or their turn)."""
        return min(self.scheduler.num_deferred, self.scheduler.num_waiting)

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running

    def kv_usage(self) -> float:
        return self.scheduler.kv_usage()

    def _streams(self) -> int:
        """Requests in the engine (running or waiting): the streams the API server is
        serving when another arrives (the calibrated model's stream_overhead)."""
        if not self.cost.stream_overhead:
            return 0
        return len(self.scheduler.running) + self.scheduler.num_waiting

    def has_work(self) -> bool:
        """Something to step: running requests, or waiting ones while not paused."""
        scheduler = self.scheduler
        return bool(scheduler.running) or (not self.paused and scheduler.num_waiting > 0)

    def next_event_time(self) -> float | None:
        """When the next step can start (`step` starts it there when told an earlier
        time), or None when idle: the end of the previous one, or, with nothing running,
        no earlier than the queue's head is ready (its request overhead) and may be
        admitted (`promise`)."""
        scheduler = self.scheduler
        if not self.has_work():
            return None
        if not scheduler.running:  # (nothing to run until the queue's head may be admitted)
            head = scheduler.waiting.peek()
            start = max(self.clock, self.admit_after)
            ready = head.ready if head is not None else None
            if scheduler.loading:  # (or a host load has ended)
                ready = self._first_ready(ready)
            if ready is not None and ready > start:
                return ready
            return start
        return self.clock

    def _first_ready(self, head_ready: float | None) -> float | None:
        """The earlier of the queue head's readiness and the first host load's end."""
        load = self.scheduler.loads_ready_at()
        if load is None:
            return head_ready
        return load if head_ready is None or load < head_ready else head_ready

    def transfers_pending(self) -> bool:
        """Requests wait for a host load, or the queue for a copy in flight (a disk
        promotion, a store a lookup found unfinished): a step that ran nothing is no stall."""
        scheduler = self.scheduler
        return bool(scheduler.loading) or (self.offload is not None and bool(self.offload.jobs)
                                           and scheduler.num_waiting > 0)

    def take_kv_events(self) -> list[tuple]:
        """The KV events recorded since the last take: the GPU prefix cache's, then the
        offload tiers' (the order of vLLM's batch: the block pool's, then the
        connector's)."""
        events = self.prefix_cache.take_events() if self.prefix_cache is not None else []
        if self.offload is not None:
            events += self.offload.take_events()
        return events

    def tokens_of(self, req: Request) -> int:
        """Tokens `req` has sampled so far (booked up to the latest step's end)."""
        return self.scheduler.group.live_output(req)

    def progress_marks(self) -> tuple[int, int]:
        """(before, after): the progress marks at the start and at the end of the latest
        step. `tokens_at(req, before)` is what a request had before that step sampled,
        `tokens_at(req, after)` what it has once the step has ended."""
        group = self.scheduler.group
        return group.mark - group.last_advance, group.mark

    def tokens_at(self, req: Request, mark: int) -> int:
        """Tokens `req` had sampled at `mark`, one of the latest step's progress marks
        (valid for live requests and for those that finished in that step)."""
        return self.scheduler.group.output_at(req, mark)

    def is_decoding(self, req: Request) -> bool:
        """True while `req` gains a token in every step."""
        return self.scheduler.group.decoding(req)

    def steps_to_next_finish(self) -> int | None:
        """Steps until the next decoding request reaches max_tokens (None: none decodes)."""
        return self.scheduler.group.steps_to_next_finish()

    def shortest_step(self) -> float:
        """A lower bound on any step's time (simulated s): one token, one attended position."""
        return self._shortest_step * self.slowdown

    def full_until(self, end: float, latest: float) -> float:
        """While the queue is full and the next step starts at `end`: the latest instant,
        at most `latest`, before which no step can admit from it without an event nobody
        can foresee (a hang-up from the batch, a raised cap): every running place is taken,
        none is freed before the next finish, which is `steps_to_next_finish` decode steps
        away, each at least `shortest_step` long. `end` itself when a place may free sooner
        (a free place, a request still prefilling, nothing decoding)."""
        scheduler = self.scheduler
        if self._freed or self._bound:  # full only by places and bounds promised till then:
            return max(end, self.admit_after)  # the promise is kept, never drawn out
        if scheduler.num_running < self.max_num_seqs or scheduler.prefilling:
            return end
        steps = scheduler.group.steps_to_next_finish()
        if steps is None or steps <= 1:
            return end
        return max(end, min(end + (steps - 1) * self.shortest_step(), latest))

    def promise(self, until: float) -> None:
        """No step starting before `until` admits from the queue; a hang-up from it or a
        raised max_waiting counts from the first step starting at or after it. A driver
        that has announced the queue full until then keeps its word with this."""
        if until > self.admit_after:
            self.admit_after = until

    def hold_until(self, end: float, result: StepResult | None = None) -> None:
        """The engine is busy until `end`: its latest step (`result`), when given, ends
        there instead of at its own end (that step's first tokens and finishes move with
        it). A driver of data-parallel MoE ranks imposes the slowest rank's end on every
        rank this way (the expert layers synchronise each step); a rank that ran no step
        of its own ran a dummy pass until then."""
        if result is not None and end > result.end:
            result.end = end
            for req in result.first_token:
                req.first_token = end
            for req in result.finished:
                req.finish_time = end
        if end > self.clock:
            self.clock = end

    def fastest_first_token(self) -> float:
        """A lower bound on any request's time from arrival to its first token: its
        overhead before it may be scheduled plus the cheapest step (simulated s)."""
        return self.cost.request_overhead + self._shortest_step * self.slowdown

    # ---- inputs ----------------------------------------------------------------------
    def _request_limits(self):
        """(largest prompt + output, why a larger one is refused) for each rule a request
        must pass: the model's length, the KV cache, one step's budget without chunking."""
        config = self.deployment.scheduler
        name = self.name
        yield self.max_model_len, lambda p, m, total: (
            f"prompt ({p} tokens) + max_tokens ({m}) = {total} exceeds "
            f"max_model_len {self.max_model_len} of {name}")
        scheduler = self.scheduler
        yield (self.total_blocks - scheduler.fixed_blocks) * self.block_size, lambda p, m, total: (
            f"{total} tokens need {scheduler.blocks_for(total)} KV blocks; "
            f"{name} has {self.total_blocks} in all")
        if not config.enable_chunked_prefill:
            yield config.max_num_batched_tokens, lambda p, m, total: (
                f"{total} tokens exceed max_num_batched_tokens {config.max_num_batched_tokens} "
                "and chunked prefill is off")

    def check(self, prompt_len: int, max_tokens: int, n: int = 1) -> None:
        """Refuse a request that could never run, with the reason (max_tokens 0: a
        pooling request, which needs room for its prompt alone)."""
        if prompt_len < 1:
            raise SubmitError("prompt must have at least 1 token")
        if max_tokens < 0:
            raise SubmitError("max_tokens must be at least 1 (0: a pooling request)")
        if n < 1:
            raise SubmitError("n must be at least 1")
        if n > self.max_num_seqs:
            raise SubmitError(f"n ({n}) exceeds max_num_seqs {self.max_num_seqs} of {self.name}: "
                              "each sequence needs a running place")
        total = prompt_len + max_tokens
        if total > self.max_request_tokens:
            for limit, why in self._request_limits():
                if total > limit:
                    raise SubmitError(why(prompt_len, max_tokens, total))
        if n > 1:  # n sequences share the prompt's full blocks and hold the rest each
            one = self.scheduler.blocks_for(total)
            need = one + (n - 1) * (one - prompt_len // self.block_size)
            if need > self.total_blocks:
                raise SubmitError(f"{n} sequences of {total} tokens need {need} KV blocks; "
                                  f"{self.name} has {self.total_blocks} in all")

    def submit(self, prompt_len: int, max_tokens: int | None, now: float, *, priority: int = 0,
               tag: object = None, token_ids: bytes = b"", n: int = 1,
               lora: LoraAdapter | None = None, kv: KvTransfer | None = None) -> Request:
        """Check and queue in one synchronous step: raises QueueSaturated when
        max_waiting (> 0) requests already wait, SubmitError when it can never run.
        `max_tokens` None (or, with a workload, any value) is settled by `lengths`;
        0 is a pooling request (vLLM's embeddings and scores): its prefill, nothing kept.
        `token_ids` (packed little-endian uint32, prompt_len of them) lets the request
        use the prefix cache; prompt_len may then be 0 (taken from them). With n > 1 it
        still waits as one request; its siblings appear in the StepResult.spawned of the
        step that completes its prefill."""
        if token_ids:
            if len(token_ids) % 4:
                raise SubmitError("prompt_token_ids must be packed 4-byte token IDs "
                                  f"(got {len(token_ids)} bytes)")
            count = len(token_ids) // 4
            if prompt_len and prompt_len != count:
                raise SubmitError(f"prompt_tokens ({prompt_len}) disagrees with the "
                                  f"{count} prompt_token_ids")
            prompt_len = count
        requested = max_tokens
        pooling = max_tokens == 0
        if pooling and self.deployment.model.pooling is None:
            raise SubmitError(f"max_tokens must be at least 1: {self.deployment.model.name} is not "
                              "a pooling model (max_tokens 0 asks for a pooling request)")
        if pooling:  # (an embedding or a score: no length to choose)
            if n != 1:
                raise SubmitError("a pooling request (max_tokens 0) samples nothing: n must be 1")
        else:
            max_tokens = self.lengths.choose(max_tokens, prompt_len, self.max_request_tokens)
        self.check(prompt_len, max_tokens, n)
        full = self.saturation()
        if full is not None:
            raise full
        if now > self.clock and not self.scheduler.has_work():
            self.clock = now  # idle: the next step starts at this arrival
        req = Request(next(self._ids), prompt_len, max_tokens or 1, now, priority, tag=tag, n=n,
                      ready=now + self.cost.request_overhead
                      + prompt_len * self.cost.prompt_token_overhead
                      + self._streams() * self.cost.stream_overhead, lora=lora,
                      # a chosen length (no cap, or a draw below it) stands for an EOS
                      eos=requested is None or max_tokens < requested or pooling,
                      # vLLM runs a pooling request as one of max_tokens 1 whose prefill's
                      # output is pooled: it finishes with the step that completes its
                      # prompt, and the token that step samples is not kept
                      pooling=pooling)
        if token_ids and (self.prefix_cache is not None or self.offload is not None) \
                and prompt_len >= self.block_size:
            req.block_hashes = block_hashes(token_ids, self.block_size,
                                            lora.name.encode() if lora is not None else b"")
            if self.record_kv_events:
                req.token_bytes = token_ids
            if self.offload is not None:
                req.offload = offload_request(kv)
        if kv is not None:
            self._connect(req, kv, token_ids)
        self.scheduler.waiting.push(req)
        if req.transfer_s > 0:  # (vLLM holds it aside until its KV has come)
            self.scheduler.pull_pending(req)
        return req

    def cancel(self, req: Request, now: float, status: Status = Status.FINISHED_CANCELLED) -> bool:
        """Remove a request from the queue or the batch, freeing its KV blocks.
        False when it had already finished."""
        if req.finished:
            return False
        if req.status is Status.WAITING and self.capacity.max_waiting:
            self._freed += 1  # its place is free from the next step (see `saturation`)
        if req.remote_decode:  # no handoff will come of it: its reservation goes
            self.handoffs.unreserve(-(-req.prompt_len // self.block_size))
        self.scheduler.finish(req, status)  # writes its live counters back
        req.finish_time = now
        return True

    def check_capacity(self, max_num_seqs: int | None = None, max_waiting: int | None = None) -> Capacity:
        """The capacity set_capacity would make, or CapacityError (nothing changes)."""
        return self.capacity.changed(self.deployment.scheduler.max_num_batched_tokens,
                                     max_num_seqs, max_waiting)

    def set_capacity(self, max_num_seqs: int | None = None, max_waiting: int | None = None) -> None:
        """Retune live. Lowering max_num_seqs drains (it gates admission only);
        lowering max_waiting affects later arrivals only; raising it (or 0: unbounded)
        takes effect from the next step's start (see `saturation`)."""
        old = self.capacity.max_waiting
        self.capacity = self.check_capacity(max_num_seqs, max_waiting)
        new = self.capacity.max_waiting
        if old and (not new or new > old) and (not self._bound or old < self._bound):
            self._bound = old

    # ---- LoRA adapters ----------------------------------------------------------------------
    def enable_lora(self, max_loras: int, max_adapters: int = MAX_ADAPTERS) -> LoraRegistry:
        """Give this base model adapters (engine.sim.lora); at most max_loras per batch."""
        self.scheduler.loras = LoraRegistry(self.deployment, max_loras, max_adapters)
        return self.scheduler.loras

    @property
    def loras(self) -> LoraRegistry | None:
        return self.scheduler.loras

    def lora_adapters_in_use(self) -> tuple[list[str], list[str]]:
        """(adapters of running requests, adapters of waiting requests), by name, as
        vllm:lora_requests_info lists them."""
        loras = self.scheduler.loras
        if loras is None:
            return [], []
        by_id = {a.id: a.name for a in loras.adapters.values()}
        running = [by_id.get(i, str(i)) for i in self.scheduler.lora_running]
        waiting: dict[str, None] = {}
        for req in self.scheduler.waiting.requests():
            if req.lora is not None:
                waiting[req.lora.name] = None
        return running, list(waiting)

    def _lora_seconds(self, decision, width: int) -> float:
        """Adapters loaded into GPU slots for this step, and the adapters' own work."""
        tokens: dict = {a: n * width for a, n in self.scheduler.group_loras.items() if n}
        for req, n in decision.chunks:
            if req.lora is not None:
                tokens[req.lora] = tokens.get(req.lora, 0) + n
        work = self.scheduler.loras.step_seconds(tokens) if tokens else 0.0
        return work + decision.lora_load_seconds

    # ---- time --------------------------------------------------------------------------
    # ---- speculative decoding -------------------------------------------------------------
    def _draft_seconds(self, g: int, batch: int, verify: float) -> float:
        cost = self.cost
        peak = rate_for(self.deployment.hardware, "bf16")[0] * cost.tp
        return draft_seconds(self.speculative.drafter, g, batch, peak, cost.bandwidth, verify)

    def _draft(self) -> tuple[int, int]:
        """(positions each decode verifies, positions it keeps) for the next step: the
        draft length by the policy, capped so the decodes fit the token budget; the
        kept count is 1 + the expected accepted tokens, carried as whole tokens."""
        spec = self.speculative
        group = self.scheduler.group
        n = group.n
        longest = min(spec.gamma, self.deployment.scheduler.max_num_batched_tokens // n - 1)
        g = longest
        if spec.policy == "goodput_budget" and longest > 0:
            best = -1.0
            for candidate in range(longest + 1):
                full, wins = group.attention(1 + candidate)
                load = attention_load(self.cost.caps, (), (full, *wins), 1 + candidate, n)
                verify = self.cost.step_cost(n * (1 + candidate), load).seconds
                seconds = verify + self._draft_seconds(candidate, n, verify)
                rate = (1.0 + spec.expected[candidate]) / seconds
                if rate > best:
                    best, g = rate, candidate
        self._accepted += 1.0 + spec.expected[g]
        keep = int(self._accepted + 1e-9)
        self._accepted -= keep
        return 1 + g, keep

    def step(self, now: float) -> StepResult:
        """Run one iteration starting at max(now, the end of the previous one)."""
        start = now if now > self.clock else self.clock
        if self.handoffs.held:
            self.expire_handoffs(start)
        if not self.scheduler.running and start < self.admit_after:
            start = self.admit_after  # nothing runs, nothing may be admitted before it
        admit = start >= self.admit_after
        if admit:
            self._freed = self._bound = 0  # a step boundary: the queue's bound as it is now
        scheduler = self.scheduler
        if not scheduler.running:
            head = scheduler.waiting.peek()
            ready = head.ready if head is not None else None
            if scheduler.loading:
                ready = self._first_ready(ready)
            if ready is not None and ready > start:
                start = ready  # idle until then: nothing was ready at `start`
        offload = self.offload
        if offload is not None:  # transfers ended by now take effect; last step's stores go
            offload.begin_step(start)
        if self.kv_residency is not None:
            self.kv_residency.now = start  # the step's hits, stores and evictions happen then
        width = advance = 1
        if self.speculative is not None and scheduler.group.n:
            width, advance = self._draft()
        decision = scheduler.schedule(start, self.capacity.max_num_seqs, width, advance,
                                       admit and not self.paused)
        if offload is not None:
            offload.offer(decision.chunks)
        decodes = decision.num_decodes
        if decodes:
            full, wins = scheduler.group.attention(width)
            decode = (full, *wins)
        else:
            decode = ()
        pairs = [(n, req.num_computed) for req, n in decision.chunks]
        prefill_tokens = sum(n for n, _ in pairs)
        num_tokens = decodes * width + prefill_tokens
        seconds = busy_compute = busy_memory = 0.0
        cost = None
        if num_tokens:
            load = attention_load(self.cost.caps, pairs, decode, width, decodes)
            cost = self.cost.step_cost(num_tokens, load)
            seconds, busy_compute, busy_memory = cost.seconds, cost.compute_seconds, cost.memory_seconds
            if width > 1:
                seconds += self._draft_seconds(width - 1, decodes, seconds)
            if scheduler.loras is not None:
                seconds += self._lora_seconds(decision, width)
            seconds *= self.slowdown
        end = start + seconds
        for req in decision.admitted:
            if req.first_scheduled < 0:
                req.first_scheduled = start
        for req in decision.preempted:
            req.preempted_at = start
        first, done, sampled = scheduler.apply(decision)
        for req in first:
            req.first_token = end
        mark = scheduler.group.mark
        for req in done:
            req.status = Status.FINISHED_LENGTH
            req.finish_time = end
            req.done_mark = mark
            if req.remote_decode:
                self._hand_off(req, end)
        self.clock = end
        if not num_tokens and offload is not None and offload.jobs and not scheduler.running:
            # nothing ran: what waits, waits for a copy in flight; no step before it ends
            self.clock = max(end, offload.jobs[0][0])
        spawned, scheduler.spawned = scheduler.spawned, []
        result = StepResult(start, end, num_tokens, sampled, prefill_tokens, decodes,
                            decision.admitted, first, done, decision.preempted, spawned,
                            busy_compute, busy_memory)
        if cost is not None:
            result.flops, result.read_bytes, result.write_bytes = (
                cost.flops, cost.read_bytes, cost.write_bytes)
        if width > 1 and decodes:  # the same expected draft for every decode of the step
            result.drafts = decodes
            result.draft_tokens = decodes * (width - 1)
            result.accepted_per_draft = advance - 1
        return result
