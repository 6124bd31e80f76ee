"""One replica of one served model at run time: its core, the pacer driving it, and the
admission state it announces.

Knows: the core (engine.sim) and its pacer (engine.drivers.pacer), sleep mode (what a
sleep frees, what a wake costs: engine.fleet.sleep), vLLM's pause modes (`pause`,
`resume`: abort, wait or keep) and its prefix-cache reset, published at once as a KV
event (`reset_prefix_cache`), the queue state as a
Session announces it (saturated or not, with the span of arrival instants over which the
queue is provably full) and a version counting its changes, the replica's LoRA adapters,
and the lifecycle the fleet (`replicas.Fleet`) orders: start, drained, stop.

Does not know gRPC, messages or Prometheus: the service builds each runtime with its
metrics (engine.metrics.updates.ModelMetrics: `on_step`, `on_lag`, `on_finished`,
`on_cadence`, `on_late`, `on_sleep`), an optional KV-event publisher (`publish(model, events,
block_size)`) and the senders' hold (`oldest`), and turns the state it announces into
messages.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from inference_lab.engine.drivers.pacer import Pacer
from inference_lab.engine.fleet.handoff import expire_later
from inference_lab.engine.fleet.sleep import TAGS, wake_seconds
from inference_lab.engine.sim.core import EngineCore

_NOT_SATURATED = (False, 0, 0, "", 0.0, 0.0)


def queue_state(core: EngineCore, pacer: Pacer | None = None,
                since: float = 0.0) -> tuple[bool, int, int, str, float, float]:
    """(saturated, waiting, max_waiting, message, since, until) as a Session announces it:
    the numbers only matter (and are only set) while saturated. since / until (wall:
    time.monotonic()) are the span of arrival instants over which the queue is provably
    full: from `since` (the instant this stretch began; 0 = now) to the first instant its
    fullness can change (Pacer.full_until, which holds the core to it)."""
    full = core.saturation()
    if full is None:
        if pacer is not None:
            pacer.not_full()
        return _NOT_SATURATED
    if pacer is None:
        return True, full.waiting, full.max_waiting, str(full), 0.0, 0.0
    until = pacer.full_until()
    return (True, full.waiting, full.max_waiting, str(full),
            since or pacer.wall_of(pacer.position()), pacer.wall_of(until))


class ModelRuntime:
    """One replica of one served model: its core, the pacer driving it, its metrics, and
    the admission state last announced to Sessions (with a version that counts its
    changes). The fleet (engine.fleet) orders its lifecycle: start, drained, stop."""

    def __init__(self, core: EngineCore, metrics, update_rate: float = 0.0,
                 time_scale: float = 1.0, kv_events=None,
                 coalesce_when_late: bool = True, replica: int = 0,
                 hold=None) -> None:
        self.core = core
        self.metrics = metrics
        self.kv_events = kv_events
        self.replica = replica
        self.key = (core.name, replica)
        self.queue_state = _NOT_SATURATED
        self.queue_version = 0
        self.on_queue_change: Callable[[], None] | None = None
        self._idle: asyncio.Event | None = None  # set once a drained replica holds nothing
        self._settled: asyncio.Event | None = None  # set once a paused replica runs nothing
        self.paused = ""  # generation paused: "", or vLLM's mode ("abort", "wait", "keep")
        self._stopped = False
        self.adapters: dict[str, object] = {}  # LoRA name -> this core's LoraAdapter
        self.on_stopped: Callable[[], None] | None = None  # its series leave the metrics
        self.sleep_level = 0  # sleep mode: 0 awake, else the level it sleeps at
        self.asleep: set[str] = set()  # the memory tags a sleep freed and no wake restored
        self.wake_s = 0.0  # what its last wake cost (modelled seconds)
        self.kv_role = core.kv_role  # P/D (engine.sim.kv_transfer): its role, and the id
        self.engine_id = core.kv_identity["remote_engine_id"]  # its handoffs carry
        on_step = metrics.on_step if kv_events is None else self._on_step
        self.pacer = Pacer(core, on_step=on_step, on_lag=metrics.on_lag,
                           on_finished=self._on_finished, on_change=self.check_queue,
                           on_cadence=metrics.on_cadence,
                           on_cadence_period=metrics.on_cadence_period, on_late=metrics.on_late, hold=hold,
                           update_rate=update_rate,
                           coalesce_when_late=coalesce_when_late, time_scale=time_scale)

    def _on_step(self, result) -> None:
        """A retired step: metrics, then the cache's events of the step as one batch."""
        self.metrics.on_step(result)
        core = self.core
        self.kv_events.publish(core.name, core.take_kv_events(), core.block_size,
                               self._lora_name)

    def _on_finished(self, req, tokens: int, last_token: float) -> None:
        """A finish: metrics, and a handoff's abort timeout set going."""
        self.metrics.on_finished(req, tokens, last_token)
        if req.handoff is not None:
            expire_later(self, req.handoff)

    def _lora_name(self, lora_id: int) -> str | None:
        """The name of this core's adapter of `lora_id` (KV events carry both, as vLLM's)."""
        for name, adapter in self.adapters.items():
            if adapter.id == lora_id:
                return name
        return None

    def check_queue(self) -> None:
        """Called wherever the queue or its bound may have moved (admissions, steps,
        cancels, capacity changes); announces a changed state to every Session."""
        state = queue_state(self.core, self.pacer, self.queue_state[4])
        if state != self.queue_state:
            self.queue_state = state
            self.queue_version += 1
            if self.on_queue_change is not None:
                self.on_queue_change()
        if self._idle is not None and not self.pacer.open_streams():
            self._idle.set()
        if self._settled is not None and not self.core.num_running:
            self._settled.set()

    # ---- sleep mode (engine.fleet.sleep) -----------------------------------------------------
    def sleep(self, level: int) -> int:
        """Put the replica to sleep at `level` (a deeper level than it sleeps at wins): its
        requests in flight end aborted (vLLM's default), its KV cache and the prefix cache
        in it are freed, its weights leave the GPU. Returns how many requests it aborted."""
        aborted = self.pacer.abort_all()
        self.core.drop_handoffs()  # its KV is gone: consumers with its params recompute
        if self.core.prefix_cache is not None:
            self.core.prefix_cache.clear()
        self.sleep_level = max(self.sleep_level, level)
        self.asleep = set(TAGS)
        self.metrics.on_sleep(self.sleep_level)
        return aborted

    def wake(self, tags: set[str]) -> float:
        """Restore `tags` of what its sleep freed; once nothing is left asleep it admits
        again. Restoring the weights takes their modelled load time: no step starts before
        it has passed, so the first requests' TTFT holds what is left of it. Returns the
        modelled seconds this wake costs."""
        tags = tags & self.asleep
        if not tags:
            return 0.0
        cost = wake_seconds(self.core.deployment, tags)
        if cost:
            core = self.core
            core.clock = max(core.clock, self.pacer.sim_now()) + cost
            self.wake_s = cost
        self.asleep -= tags
        if not self.asleep:
            self.sleep_level = 0
        self.metrics.on_sleep(self.sleep_level, cost if cost else None)
        self.pacer.poke()
        return cost

    # ---- pausing generation (vLLM's dev-mode /pause, /resume) -----------------------------
    def pause(self, mode: str) -> int:
        """Pause generation as vLLM's `mode` does: "abort" ends every request in flight
        aborted and admits nothing more from the queue (vLLM's PAUSED_NEW); "wait" admits
        nothing more from the queue and lets the running requests finish (`settled`);
        "keep" freezes the replica (PAUSED_ALL: its modelled clock stops, every request
        stays where it is). Arrivals still queue, under the queue's bound. Returns how many
        requests it aborted."""
        aborted = 0
        if mode == "keep":
            self.pacer.freeze()
        else:
            if self.paused == "keep":  # (a deeper pause's freeze ends: running ones step on)
                self.pacer.thaw()
            if mode == "abort":
                aborted = self.pacer.abort_all()
            self.core.paused = True
            self.pacer.poke()
        self.paused = mode
        return aborted

    async def settled(self) -> None:
        """Resolves once the replica runs nothing (a "wait" pause has taken hold)."""
        while self.core.num_running:
            self._settled = asyncio.Event()
            await self._settled.wait()
        self._settled = None

    def resume(self) -> None:
        """Generation goes on: the queue is admitted from again, a frozen replica thaws
        (the service re-applies a replica stall, which keeps it frozen)."""
        if self.paused == "keep":
            self.pacer.thaw()
        self.paused = ""
        self.core.paused = False
        self.pacer.poke()

    def reset_prefix_cache(self, external: bool = False) -> int:
        """Forget every cached block no running request uses (vLLM's reset_prefix_cache),
        published at once (AllBlocksCleared when none is left); with `external` the
        offload tiers' idle chunks too (vLLM's reset_external: the connector's
        reset_cache, each chunk a BlockRemoved of its medium). Returns how many."""
        core = self.core
        cache = core.prefix_cache
        if cache is None:
            return 0
        cleared = cache.num_evictable
        cache.clear()
        events = cache.take_events()
        if external and core.offload is not None:
            cleared += core.offload.reset()
            events += core.offload.take_events()
        if self.kv_events is not None:
            self.kv_events.publish(core.name, events, core.block_size, self._lora_name)
        return cleared

    # ---- lifecycle (engine.fleet.Fleet) --------------------------------------------------
    def start(self) -> None:
        self.pacer.start()

    def open_streams(self) -> int:
        return self.pacer.open_streams()

    async def drained(self) -> None:
        """Resolves once no request is left (the fleet admits nothing more to it)."""
        while self.pacer.open_streams():
            self._idle = asyncio.Event()
            await self._idle.wait()

    async def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            await self.pacer.stop()
            if self.on_stopped is not None:
                self.on_stopped()
