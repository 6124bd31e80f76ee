"""Data-parallel ranks offline: vLLM's `--data-parallel-size D` as D EngineCores of one
deployment, each with its own scheduler, KV cache and waiting bound, run against a
workload as the offline driver runs one core (the clock jumps from event to event).

Knows:
- routing: each arrival goes to the rank `common.dp_balance.RankBalancer.pick()` chooses
  from the counts the `Coordinator` last published (stale between publications, spread
  by the front end's local additions), or to the rank it names (vLLM's
  `X-data-parallel-rank`: no local addition). A publication takes the cores' real
  (waiting, running) at its instant: the coordinator is asked at every event (an arrival,
  a step's start) and at the instant it would next publish (100 ms after the last while
  the counts move, 5 s while they do not);
- admission: each rank's own (its max_waiting refuses with a 529 whatever the others hold);
- steps: a dense deployment's ranks step independently; an MoE deployment's ranks step
  in lockstep (vLLM aligns their forward passes: the expert layers synchronise every
  step), so whenever any rank has work every rank steps, each aligned step lasts as long
  as the slowest rank's, and a rank with nothing to run runs vLLM's dummy batch (one token
  attending one position: `EngineCore.shortest_step`), counted in `dummy_passes`. When no
  rank has work, no rank steps (vLLM's DP wave ends).

Does not know the wall clock (except to report the CPU a run took), sockets or HTTP.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field

from inference_lab.common.dp_balance import Coordinator, RankBalancer
from inference_lab.common.workload import WorkloadSpec, draw_adapter
from inference_lab.engine.drivers.offline import (RunRecorder, _adapters, distribution, prefix_cache,
                                                  summarise)
from inference_lab.engine.drivers.workload_feed import WorkloadFeed
from inference_lab.engine.sim.core import EngineCore, QueueSaturated, StepResult, SubmitError
from inference_lab.engine.sim.request import Request
from inference_lab.engine.sim.specs import Deployment

__all__ = ["DataParallelRanks", "is_moe", "run_data_parallel"]


def is_moe(deployment: Deployment) -> bool:
    """True when the model routes tokens to experts (any weight stream has experts)."""
    return any(s.num_experts for s in deployment.model.weight_streams)


@dataclass(slots=True)
class RankRecord:
    """One rank's share of a run (simulated seconds)."""

    requests: int = 0  # routed to it
    admitted: int = 0
    refused: int = 0  # its waiting bound was reached (529)
    invalid: int = 0  # could never run
    steps: int = 0  # steps of its own (dummy passes not counted)
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)


class DataParallelRanks:
    """D EngineCores of one deployment behind one front end's balancer, stepped in
    lockstep (MoE) or independently (dense). Told the time by its driver."""

    __slots__ = ("cores", "lockstep", "balancer", "coordinator", "ranks", "_published",
                 "_now", "publications", "dummy_passes", "aligned_steps")

    def __init__(self, deployment: Deployment, size: int, *, lockstep: bool | None = None,
                 slowdown: float = 1.0) -> None:
        if size < 1:
            raise ValueError(f"the data-parallel size must be at least 1, got {size}")
        self.cores = [EngineCore(deployment) for _ in range(size)]
        for core in self.cores:
            core.slowdown = slowdown
        self.lockstep = is_moe(deployment) if lockstep is None else lockstep
        self.balancer = RankBalancer(size)
        self.coordinator = Coordinator()
        self.ranks = [RankRecord() for _ in range(size)]
        self._published: list[tuple[int, int]] | None = None  # the counts last published
        self._now = 0.0  # the latest time told
        self.publications = 0
        self.dummy_passes = 0  # rank-steps that ran vLLM's one-token dummy batch
        self.aligned_steps = 0  # lockstep steps in which some rank ran real work

    # ---- the balancer's inputs ---------------------------------------------------------
    def counts(self) -> list[tuple[int, int]]:
        """Every rank's (waiting, running) as its core holds them now."""
        return [(c.scheduler.num_waiting, c.scheduler.num_running) for c in self.cores]

    def observe(self, now: float) -> bool:
        """The coordinator looks at the counts at `now` and publishes them if due."""
        if now > self._now:
            self._now = now
        at = self.balancer.published_at
        if at is not None and now < at + self.coordinator.interval:
            return False  # (too soon for any publication: the counts need not be read)
        counts = self.counts()
        if not self.coordinator.due(now, counts):
            return False
        self.balancer.publish(counts, now)
        self._published = counts
        self.publications += 1
        return True

    def next_publication(self, before: float = math.inf) -> float | None:
        """When the coordinator would next publish, the counts staying as they are now
        (no earlier than the latest time told: counts that moved after the interval had
        passed are published at once); None before its first publication, or when that
        is not before `before`."""
        at = self.balancer.published_at
        if at is None or at + self.coordinator.interval >= before:
            return None
        moved = self.counts() != self._published
        t = at + (self.coordinator.interval if moved else self.coordinator.idle_interval)
        t = t if t > self._now else self._now
        return t if t < before else None

    def route(self, now: float, rank: int | None = None) -> int:
        """The rank of a request arriving at `now`: the one it names, else the balancer's."""
        self.observe(now)
        if rank is not None:
            if not 0 <= rank < len(self.cores):
                raise ValueError(f"data-parallel rank {rank} out of range [0, {len(self.cores)})")
            return rank
        return self.balancer.pick()

    def submit(self, rank: int, now: float, prompt_len: int, max_tokens: int | None,
               **kwargs) -> Request:
        """`EngineCore.submit` on `rank`'s core, counted in its figures (QueueSaturated
        and SubmitError pass through, counted as refused and invalid)."""
        record = self.ranks[rank]
        record.requests += 1
        try:
            req = self.cores[rank].submit(prompt_len, max_tokens, now, **kwargs)
        except QueueSaturated:
            record.refused += 1
            raise
        except SubmitError:
            record.invalid += 1
            raise
        record.admitted += 1
        return req

    def finished(self, rank: int, req: Request) -> None:
        """A request of `rank` finished: its TTFT and end-to-end latency count."""
        record = self.ranks[rank]
        record.ttft.append(req.first_token - req.arrival)
        record.e2e.append(req.finish_time - req.arrival)

    # ---- steps -------------------------------------------------------------------------
    def next_step_time(self, skip: Container[int] = ()) -> float | None:
        """When the next step starts (the earliest rank's next event, ranks in `skip`
        left out), or None: no work."""
        best = None
        for rank, core in enumerate(self.cores):
            if rank in skip:
                continue
            t = core.next_event_time()
            if t is not None and (best is None or t < best):
                best = t
        return best

    def step(self, now: float, skip: Container[int] = ()) -> list[tuple[int, StepResult]]:
        """Step every rank whose next event is due at `now` (the earliest: `next_step_time`),
        but those in `skip` (dense ranks whose last step a driver has not yet delivered).
        Lockstep: the step's end is the latest of those ranks' ends and of the other
        ranks' dummy passes, imposed on every rank."""
        self.observe(now)
        stepped = []
        for rank, core in enumerate(self.cores):
            if rank in skip:
                continue
            t = core.next_event_time()
            if t is not None and t <= now:
                stepped.append((rank, core.step(now)))
                self.ranks[rank].steps += 1
        if not self.lockstep:
            return stepped
        end = now
        busy = set()
        for rank, result in stepped:
            if result.num_tokens:
                busy.add(rank)
                if result.end > end:
                    end = result.end
        if not busy:  # (nothing ran anywhere: no aligned step)
            return stepped
        self.aligned_steps += 1
        for rank, core in enumerate(self.cores):
            if rank not in busy:  # vLLM's dummy batch: one token, the weights read once
                self.dummy_passes += 1
                dummy_end = now + core.shortest_step()
                if dummy_end > end:
                    end = dummy_end
        results = dict(stepped)
        for rank, core in enumerate(self.cores):
            core.hold_until(end, results.get(rank))
        return stepped

    # ---- the summary's part ------------------------------------------------------------
    def summary(self) -> dict:
        ms = lambda xs: distribution(xs)["p50"] * 1000.0  # noqa: E731
        return {
            "size": len(self.cores),
            "lockstep": self.lockstep,
            "aligned_steps": self.aligned_steps,
            "dummy_passes": self.dummy_passes,
            "publications": self.publications,
            "ranks": [{"rank": i, "requests": r.requests, "admitted": r.admitted,
                       "refused": r.refused, "invalid": r.invalid, "completed": len(r.e2e),
                       "steps": r.steps, "preemptions": core.scheduler.num_preemptions,
                       "ttft_p50_ms": ms(r.ttft), "e2e_p50_ms": ms(r.e2e),
                       # KV offloading: the prompt tokens this rank's own host tier served
                       **({"host_hits": core.offload.stats.host_tokens}
                          if core.offload is not None else {})}
                      for i, (r, core) in enumerate(zip(self.ranks, self.cores))],
        }


def run_data_parallel(deployment: Deployment, spec: WorkloadSpec, size: int, *,
                      seed: int | None = None,
                      on_progress: Callable[[int, int], None] | None = None,
                      slowdown: float = 1.0, tokenizer=None, lockstep: bool | None = None,
                      arrivals: Iterator[tuple] | None = None,
                      records: list[tuple[int, Request | None]] | None = None) -> dict:
    """Simulate `spec` on `size` data-parallel ranks of `deployment` and return the
    offline driver's summary (overall) plus `data_parallel`: the ranks' figures, the
    aligned steps, dummy passes and publications. `lockstep` defaults to whether the
    model is MoE. `arrivals` replaces the workload's open-loop arrivals ((time, prompt
    tokens, output tokens, token IDs or b"", and optionally the rank the request names)
    each, in time order); `records` gets (rank, its Request or None when refused) per
    arrival, in arrival order."""
    dp = DataParallelRanks(deployment, size, lockstep=lockstep, slowdown=slowdown)
    cores = dp.cores
    feed = WorkloadFeed(spec, seed=seed, tokenizer=tokenizer, arrivals=arrivals)
    rec = RunRecorder()
    total = spec.num_requests
    adapters = [_adapters(core, spec) for core in cores]
    pick = random.Random((spec.seed if seed is None else seed) ^ 0x10_7A)  # adapter draws
    done = 0
    report_every = max((total or 0) // 200, 100)
    cpu0 = time.process_time()
    steps = 0

    def submit(now: float, prompt_len: int, output_len: int, key: object, tokens: bytes,
               named: int | None = None) -> bool:
        rank = dp.route(now, named)
        rec.arrived(now)
        req = None
        try:
            lora = draw_adapter(adapters[rank], pick) if adapters[rank] else None
            req = dp.submit(rank, now, prompt_len if not tokens else 0, output_len, tag=key,
                            token_ids=tokens, lora=lora)
        except QueueSaturated:
            rec.rejected_saturated += 1
        except SubmitError:
            rec.rejected_invalid += 1
        if records is not None:
            records.append((rank, req))
        return req is not None

    done += feed.start(submit)
    while True:
        t_step = dp.next_step_time()
        t_feed = feed.next_time()
        t_next = min((t for t in (t_step, t_feed) if t is not None), default=None)
        if t_next is None:
            break
        t_pub = dp.next_publication(t_next) if feed.more_to_come() else None
        if t_pub is not None:
            dp.observe(t_pub)  # (before an arrival or a step at the same instant)
            continue
        if t_feed is not None and t_feed == t_next:
            done += feed.take(submit)
            continue
        for rank, result in dp.step(t_step):
            steps += 1
            core = cores[rank]
            rec.step(core, result)
            for req in result.finished:
                dp.finished(rank, req)
                rec.finished(req)
                done += 1
                if on_progress and done % report_every == 0:
                    on_progress(done, total or rec.total)
                if feed.closed:  # the user sends its next request when this one ends
                    feed.user_free(req.tag, req.finish_time)
    cpu = time.process_time() - cpu0
    if on_progress:
        on_progress(done, total or rec.total)
    summary = summarise(rec, cores[0], steps, cpu)
    preemptions = sum(c.scheduler.num_preemptions for c in cores)
    completed = summary["requests"]["completed"]
    summary["preemptions"] = {"total": preemptions,
                              "per_request_mean": preemptions / completed if completed else 0.0}
    summary["prefix_cache"] = prefix_cache(cores)
    summary["data_parallel"] = dp.summary()
    return summary
