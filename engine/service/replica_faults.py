"""Replica-level faults: a whole engine crashes, stalls, or runs slow for a while.

Knows: the three faults and their timers. CRASH ends the process right after the RPC's
answer has had time to leave (`os._exit`, no cleanup: what a segfault or an OOM kill
looks like to everyone else; a supervisor restarts it). STALL freezes every model's pacer
(the modelled clock stops: no step, no token, no finish) and turns gRPC health NOT_SERVING
for S wall seconds; requests in flight resume afterwards where they were, and arrivals
queue meanwhile. SLOW multiplies every step time of every model by k (thermal throttling)
for S seconds, or until cleared. CLEAR ends both now.

Does not know: gRPC messages (engine.service.rpc converts), or how a step is timed
(EngineCore.slowdown) and paced (Pacer.freeze/thaw).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

CRASH_EXIT_STATUS = 70  # EX_SOFTWARE: "an internal software error"
CRASH_DELAY_S = 0.1  # the answer to the RPC leaves first


@dataclass(frozen=True, slots=True)
class FaultStatus:
    stalled_for_s: float
    slow_factor: float
    slow_for_s: float


class ReplicaFaults:
    def __init__(self, runtimes: list, set_serving: Callable[[bool], Awaitable[None]]) -> None:
        self.runtimes = runtimes  # ModelRuntime: .core (slowdown) and .pacer (freeze/thaw)
        self._set_serving = set_serving
        self.loop = asyncio.get_running_loop()
        self._stall_until: float | None = None
        self._stall_timer: asyncio.TimerHandle | None = None
        self._slow_until: float | None = None  # None with factor != 1: until cleared
        self._slow_timer: asyncio.TimerHandle | None = None
        self.slow_factor = 1.0
        self._tasks: set[asyncio.Task] = set()

    # ---- the faults ---------------------------------------------------------------------
    def crash(self) -> None:
        log.error("crash fault injected: the engine exits with status %d in %.0f ms",
                  CRASH_EXIT_STATUS, CRASH_DELAY_S * 1000)
        self.loop.call_later(CRASH_DELAY_S, os._exit, CRASH_EXIT_STATUS)

    def stall(self, seconds: float) -> None:
        """Freeze for `seconds` from now (a stall in progress is extended or shortened)."""
        if self._stall_timer is not None:
            self._stall_timer.cancel()
        else:
            for rt in self.runtimes:
                rt.pacer.freeze()
            self._health(False)
        self._stall_until = self.loop.time() + seconds
        self._stall_timer = self.loop.call_later(seconds, self._end_stall)
        log.warning("stall fault injected: every model frozen for %.3f s", seconds)

    def _end_stall(self) -> None:
        self._stall_timer = self._stall_until = None
        for rt in self.runtimes:
            rt.pacer.thaw()
        self._health(True)
        log.warning("stall fault over: the engine resumes")

    def slow(self, factor: float, seconds: float) -> None:
        """Step times x `factor` for `seconds` (0: until cleared)."""
        if self._slow_timer is not None:
            self._slow_timer.cancel()
            self._slow_timer = None
        self._set_slowdown(factor)
        self._slow_until = self.loop.time() + seconds if seconds > 0 else None
        if seconds > 0:
            self._slow_timer = self.loop.call_later(seconds, self._end_slow)
        log.warning("slow fault injected: step times x %g for %s", factor,
                    f"{seconds:.3f} s" if seconds > 0 else "until cleared")

    def _end_slow(self) -> None:
        self._slow_timer = self._slow_until = None
        self._set_slowdown(1.0)
        log.warning("slow fault over: step times as modelled")

    def clear(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._end_stall()
        if self._slow_timer is not None:
            self._slow_timer.cancel()
        if self.slow_factor != 1.0 or self._slow_timer is not None:
            self._end_slow()

    # ---- state --------------------------------------------------------------------------
    def status(self) -> FaultStatus:
        now = self.loop.time()
        stalled = max(self._stall_until - now, 0.0) if self._stall_until is not None else 0.0
        slow_left = max(self._slow_until - now, 0.0) if self._slow_until is not None else 0.0
        return FaultStatus(stalled, self.slow_factor, slow_left)

    @property
    def stalled(self) -> bool:
        return self._stall_timer is not None

    def _set_slowdown(self, factor: float) -> None:
        self.slow_factor = factor
        for rt in self.runtimes:
            rt.core.slowdown = factor
            rt.pacer.poke()

    def _health(self, serving: bool) -> None:
        task = self.loop.create_task(self._set_serving(serving))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
