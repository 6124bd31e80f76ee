"""The offline driver of a disaggregated deployment: prefill and decode pools of EngineCores,
the router between them and the KV pulls, on one simulated clock, as fast as the CPU allows.

Plays what the served path does behind vllm-router's P/D mode: each request goes to a
prefill replica (a kv_producer core) with max_tokens 1 and `do_remote_decode`; when its
prefill ends, the producer holds its prompt's blocks (the core's handoff) and the request
goes on to a decode replica (a kv_consumer core) with the handoff's tokens to pull, which
books the pull on its link (the core's LinkQueue) and schedules the request once the last
byte has come; the producer frees the blocks when the pull has ended, as the engine's fleet
does (engine.fleet.handoff). The HTTP hops cost nothing here, so a request's TTFT is its
prefill replica's time to its token plus the decode replica's time to its first token,
exactly; the served path adds only its hops.

Knows workloads (as engine.drivers.offline) and the router's choice of a replica per pool
(least loaded: fewest waiting + running, the lowest index on a tie; or round robin).
Does not know the wall clock, except to report how much CPU the run took.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from inference_lab.common.pd_pick import PoolPicker
from inference_lab.common.workload import WorkloadSpec
from inference_lab.engine.drivers.offline import _timing, distribution, prefix_cache
from inference_lab.engine.drivers.workload_feed import WorkloadFeed
from inference_lab.engine.sim.core import EngineCore, QueueSaturated, SubmitError
from inference_lab.engine.sim.kv_transfer import (
    CONSUMER, PRODUCER, KvTransfer, LinkQueue, PdLayout, link_preset,
)
from inference_lab.engine.sim.specs import Deployment

__all__ = ["PdError", "run_disaggregated"]

_REMOTE_DECODE = KvTransfer(remote_decode=True)
_RELEASE, _ROUTE, _RETURN = 0, 1, 2  # pending events, in this order at one instant


class PdError(ValueError):
    """A workload or layout the disaggregated simulation cannot run; names the key."""


@dataclass(slots=True)
class Flow:
    """One client request: its arrival, its prompt, and its prefill and decode requests."""

    key: object  # the closed-loop user or the conversation
    arrival: float
    prompt_len: int
    output_len: int
    tokens: bytes
    prefill: object = None  # its Request on the prefill replica
    decode: object = None  # ... and on the decode replica


@dataclass(slots=True)
class Pool:
    """One pool's cores and what its steps and requests did."""

    cores: list[EngineCore]
    picker: PoolPicker  # the router's pick of one of them
    busy_steps: int = 0
    steps: int = 0
    kv_util: float = 0.0
    kv_peak: float = 0.0
    flops_util: float = 0.0
    bandwidth_util: float = 0.0
    ttft: list[float] = field(default_factory=list)
    queue: list[float] = field(default_factory=list)
    extra: list[float] = field(default_factory=list)  # prefill: its step time; decode: the pull
    per_token: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    rejected_saturated: int = 0
    rejected_invalid: int = 0

    def step(self, core: EngineCore, result) -> None:
        self.steps += 1
        span = result.end - result.start
        if not result.num_tokens or span <= 0:
            return
        self.busy_steps += 1
        kv = core.kv_usage()
        self.kv_util += kv
        if kv > self.kv_peak:
            self.kv_peak = kv
        self.flops_util += min(result.compute_seconds / span, 1.0)
        self.bandwidth_util += min(result.memory_seconds / span, 1.0)

    def pick(self) -> int:
        """The replica the router sends the next request to (least loaded: the fewest
        waiting + running)."""
        cores = self.cores
        return self.picker.pick(lambda i: cores[i].scheduler.num_waiting + cores[i].scheduler.num_running)


def _ms(xs: list[float]) -> dict[str, float]:
    return {k: v * 1000.0 for k, v in distribution(xs).items()}


def _utilization(pool: Pool) -> dict:
    busy = pool.busy_steps or 1
    return {"avg_kv_cache_util": pool.kv_util / busy, "peak_kv_cache_util": pool.kv_peak,
            "avg_flops_util": pool.flops_util / busy,
            "avg_bandwidth_util": pool.bandwidth_util / busy}


def _check(spec: WorkloadSpec) -> None:
    if spec.pooling:
        raise PdError("pooling: a pooling workload has no decode to disaggregate")
    if spec.lora_adapters:
        raise PdError("lora_adapters: LoRA adapters are not simulated on a disaggregated "
                      "deployment")


def run_disaggregated(deployment: Deployment, spec: WorkloadSpec, layout: PdLayout, *,
                      seed: int | None = None,
                      on_progress: Callable[[int, int], None] | None = None,
                      tokenizer=None,
                      arrivals: Iterator[tuple[float, int, int, bytes]] | None = None,
                      records: list[Flow] | None = None) -> dict:
    """Simulate `spec` on `layout.prefill` prefill and `layout.decode` decode replicas of
    `deployment` and return the summary (engine.drivers.offline's shape, overall, plus
    `pd`: per pool). `arrivals` replaces the workload's open-loop arrivals ((time, prompt
    tokens, output tokens, token IDs or b"") each, in time order); `records` gets every
    completed request's Flow. PdError for a workload it cannot run."""
    _check(spec)
    link = link_preset(layout.link, deployment.hardware)

    def core(role: str) -> EngineCore:
        c = EngineCore(deployment)
        c.kv_role = role
        c.link = LinkQueue(link)
        return c

    prefill = Pool([core(PRODUCER) for _ in range(layout.prefill)],
                   PoolPicker(range(layout.prefill), layout.policy))
    decode = Pool([core(CONSUMER) for _ in range(layout.decode)],
                  PoolPicker(range(layout.decode), layout.policy))
    cores = prefill.cores + decode.cores
    npre = layout.prefill
    feed = WorkloadFeed(spec, seed=seed, tokenizer=tokenizer, arrivals=arrivals)
    total = spec.num_requests
    # each core's next step (inf: idle); a core blocked by held handoffs waits for a release
    next_t = [math.inf] * len(cores)
    blocked = [False] * len(cores)
    pending: list = []  # (time, kind, seq, payload): releases, routes, returning users
    seq = itertools.count()
    ttft: list[float] = []
    e2e: list[float] = []
    per_token: list[float] = []
    counts = {"total": 0, "input": 0, "output": 0, "done": 0, "recomputed": 0, "pulled": 0}
    first_arrival, last_finish = math.inf, 0.0
    report_every = max((total or 0) // 200, 100)
    steps = 0
    cpu0 = time.process_time()

    def refresh(i: int) -> None:
        t = cores[i].next_event_time()
        next_t[i] = math.inf if t is None or blocked[i] else t

    def progress() -> None:
        counts["done"] += 1
        if on_progress and counts["done"] % report_every == 0:
            on_progress(counts["done"], total or counts["total"])

    def submit(now: float, prompt_len: int, output_len: int, key: object, tokens: bytes) -> bool:
        nonlocal first_arrival
        counts["total"] += 1
        if now < first_arrival:
            first_arrival = now
        flow = Flow(key, now, prompt_len if not tokens else len(tokens) // 4, output_len, tokens)
        i = prefill.pick()
        try:
            flow.prefill = cores[i].submit(prompt_len if not tokens else 0, 1, now, tag=flow,
                                           token_ids=tokens, kv=_REMOTE_DECODE)
        except QueueSaturated:
            prefill.rejected_saturated += 1
            return False
        except SubmitError:
            prefill.rejected_invalid += 1
            return False
        refresh(i)
        return True

    def route_from(now: float, flow: Flow, producer: int) -> None:
        handoff = flow.prefill.handoff
        pcore = cores[producer]
        if handoff is not None:
            handoff = pcore.take_handoff(handoff.request_id, handoff.digest, now)
        j = decode.pick()
        dcore = cores[npre + j]
        kv = KvTransfer(False, handoff.tokens if handoff is not None else 0)
        try:
            flow.decode = dcore.submit(flow.prompt_len if not flow.tokens else 0, flow.output_len,
                                       now, tag=flow, token_ids=flow.tokens, kv=kv)
        except (QueueSaturated, SubmitError) as exc:
            if isinstance(exc, QueueSaturated):
                decode.rejected_saturated += 1
            else:
                decode.rejected_invalid += 1
            if handoff is not None:  # no pull: the blocks are freed at once, uncounted
                pcore.free_handoff(handoff, pulled=False)
                blocked[producer] = False
                refresh(producer)
            progress()
            if feed.closed:
                feed.user_free(flow.key)
            return
        if handoff is not None:  # the producer frees the blocks when the pull has ended
            heapq.heappush(pending, (flow.decode.ready, _RELEASE, next(seq), (producer, handoff)))
        else:
            counts["recomputed"] += 1
        refresh(npre + j)

    if feed.start(submit):
        progress()
    while True:
        t_core = min(next_t)
        t_pend = pending[0][0] if pending else math.inf
        t_feed = feed.next_time()
        t_feed = math.inf if t_feed is None else t_feed
        if t_pend <= t_core and t_pend <= t_feed:
            if t_pend == math.inf:
                break
            now, kind, _, payload = heapq.heappop(pending)
            if kind == _RELEASE:
                producer, handoff = payload
                if handoff is not None:  # (None: a blocked producer's abort timeout)
                    cores[producer].free_handoff(handoff)
                    counts["pulled"] += 1
                blocked[producer] = False
                refresh(producer)
            elif kind == _ROUTE:
                route_from(now, *payload)
            else:
                feed.user_free(payload)
                if feed.users_arrive(now, submit):
                    progress()
            continue
        if t_feed <= t_core:
            if feed.take(submit):
                progress()
            continue
        i = next_t.index(t_core)
        c = cores[i]
        result = c.step(t_core)
        steps += 1
        if i < npre:
            prefill.step(c, result)
            for req in result.finished:
                flow = req.tag
                prefill.ttft.append(req.first_token - req.arrival)
                prefill.queue.append(req.first_scheduled - req.arrival)
                prefill.extra.append(req.first_token - req.first_scheduled)
                heapq.heappush(pending, (result.end, _ROUTE, next(seq), (flow, i)))
        else:
            decode.step(c, result)
            for req in result.finished:
                flow = req.tag
                first = req.first_token - req.arrival
                decode.ttft.append(first)
                decode.queue.append(req.first_scheduled - req.ready)
                decode.extra.append(req.transfer_s)
                decode.e2e.append(req.finish_time - req.arrival)
                counts["input"] += flow.prompt_len
                counts["output"] += req.max_tokens
                t = req.first_token - flow.arrival
                whole = req.finish_time - flow.arrival
                ttft.append(t)
                e2e.append(whole)
                if req.max_tokens > 1:
                    tpot = (req.finish_time - req.first_token) / (req.max_tokens - 1)
                    per_token.append(tpot)
                    decode.per_token.append(tpot)
                last_finish = req.finish_time
                if records is not None:
                    records.append(flow)
                progress()
                if feed.closed:
                    heapq.heappush(pending, (req.finish_time, _RETURN, next(seq), flow.key))
        # (a step that ran nothing while a host load or copy is in flight waits for that)
        if not result.num_tokens and not c.scheduler.running and c.has_work() \
                and not c.transfers_pending():
            blocked[i] = True  # its queue waits for blocks a pull will give back
            if not any(p[1] == _RELEASE and p[3][0] == i for p in pending):
                expires = min((h.expires for h in c.handoffs.held.values()), default=None)
                if expires is None:
                    raise RuntimeError(f"replica {i} cannot run its queue and waits for nothing")
                heapq.heappush(pending, (expires, _RELEASE, next(seq), (i, None)))
        t = c.next_event_time()
        next_t[i] = math.inf if t is None or blocked[i] else t
    cpu = time.process_time() - cpu0
    if on_progress:
        on_progress(counts["done"], total or counts["total"])
    return _summary(deployment, layout, link, prefill, decode, ttft, e2e, per_token, counts,
                    first_arrival, last_finish, steps, cpu)


def _summary(dep: Deployment, layout: PdLayout, link, prefill: Pool, decode: Pool,
             ttft: list[float], e2e: list[float], per_token: list[float], counts: dict,
             first_arrival: float, last_finish: float, steps: int, cpu: float) -> dict:
    span = max(last_finish - (first_arrival if counts["total"] else 0.0), 1e-12)
    completed = len(e2e)
    cores = prefill.cores + decode.cores
    busy = (prefill.busy_steps + decode.busy_steps) or 1
    preemptions = sum(c.scheduler.num_preemptions for c in cores)
    saturated = prefill.rejected_saturated + decode.rejected_saturated
    invalid = prefill.rejected_invalid + decode.rejected_invalid
    pools = {}
    for name, pool in (("prefill", prefill), ("decode", decode)):
        lat = {"ttft_ms": _ms(pool.ttft), "queue_ms": _ms(pool.queue)}
        if name == "prefill":
            lat["prefill_ms"] = _ms(pool.extra)
        else:
            lat["transfer_ms"] = _ms(pool.extra)
            lat["per_token_ms"] = _ms(pool.per_token)
            lat["e2e_ms"] = _ms(pool.e2e)
        pools[name] = {
            "replicas": len(pool.cores),
            "latency_metrics": lat,
            "utilization": _utilization(pool),
            "requests": {"rejected_queue_saturated": pool.rejected_saturated,
                         "rejected_invalid": pool.rejected_invalid},
            "preemptions": sum(c.scheduler.num_preemptions for c in pool.cores),
            "prefix_cache": prefix_cache(pool.cores),
            "steps": pool.steps,
        }
    return {
        "model": dep.name,
        "hardware": dep.hardware.name,
        "unmodelled": list(dep.unmodelled),
        "timing": _timing(dep),
        "latency_metrics": {"ttft_ms": _ms(ttft), "e2e_ms": _ms(e2e), "per_token_ms": _ms(per_token)},
        "throughput_metrics": {
            "input_tokens_per_sec": counts["input"] / span,
            "output_tokens_per_sec": counts["output"] / span,
            "requests_per_sec": completed / span,
        },
        "utilization": {
            "avg_kv_cache_util": (prefill.kv_util + decode.kv_util) / busy,
            "avg_flops_util": (prefill.flops_util + decode.flops_util) / busy,
            "avg_bandwidth_util": (prefill.bandwidth_util + decode.bandwidth_util) / busy,
        },
        "requests": {
            "completed": completed,
            "total": counts["total"],
            "rejected": invalid,
            "rejected_queue_saturated": saturated,
            "rejected_invalid": invalid,
        },
        "preemptions": {"total": preemptions,
                        "per_request_mean": preemptions / completed if completed else 0.0},
        "prefix_cache": prefix_cache(prefill.cores),
        "pd": {
            "prefill_replicas": layout.prefill,
            "decode_replicas": layout.decode,
            "policy": layout.policy,
            "link": {"name": link.name, "bandwidth_gb_per_s": link.bandwidth / 1e9,
                     "latency_ms": link.latency * 1e3},
            "transfers": {"pulled": counts["pulled"], "recomputed": counts["recomputed"],
                          "external_tokens": sum(c.transfers.external_hits for c in decode.cores)},
            **pools,
        },
        "simulation": {
            "simulated_seconds": span,
            "steps": steps,
            "cpu_seconds": cpu,
            "output_tokens_per_cpu_second": counts["output"] / cpu if cpu else 0.0,
        },
    }
