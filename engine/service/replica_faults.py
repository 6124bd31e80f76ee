"""Replica-level faults: the whole engine, or one replica, crashes, stalls, or runs slow.

Knows: the three faults, their timers, and what each targets: every replica (the whole
engine, `replica` None) or one replica index (replica i of every model, what its gateway
port fronts). CRASH of the whole engine ends the process right after the RPC's answer has
had time to leave (`os._exit`, no cleanup: what a segfault or an OOM kill looks like; a
supervisor restarts it); CRASH of one replica restarts that replica alone (its requests in
flight end as aborted, its series start from zero, it is ready again after its start-up
delay, with its live capacity), as a crashed pod comes back. STALL freezes the target's
pacers (the modelled clock stops: no step, no token, no finish) for S wall seconds;
requests in flight resume afterwards where they were, and arrivals queue meanwhile; the
engine's gRPC health turns NOT_SERVING for a stall of the whole engine only (a stalled
replica's own gateway port answers 503 on /health). SLOW multiplies the target's step
times by k for S seconds, or until cleared. CLEAR ends the target's stall and slowdown
(without a replica: every fault of every replica). A replica's effective state combines
both targets: frozen while either stalls, slowed by the product of both factors.

Does not know: gRPC messages (engine.service.control converts), how a step is timed
(EngineCore.slowdown) and paced (Pacer.freeze/thaw), or how a replica restarts (the
server's `restart` callable).
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


class _Target:
    """One target's stall and slowdown (the whole engine's, or one replica's)."""

    __slots__ = ("stall_until", "stall_timer", "slow_until", "slow_timer", "slow_factor")

    def __init__(self) -> None:
        self.stall_until: float | None = None
        self.stall_timer: asyncio.TimerHandle | None = None
        self.slow_until: float | None = None  # None with factor != 1: until cleared
        self.slow_timer: asyncio.TimerHandle | None = None
        self.slow_factor = 1.0

    @property
    def stalled(self) -> bool:
        return self.stall_timer is not None

    def left(self, now: float) -> tuple[float, float]:
        """(stall seconds left, slowdown seconds left)."""
        return (max(self.stall_until - now, 0.0) if self.stall_until is not None else 0.0,
                max(self.slow_until - now, 0.0) if self.slow_until is not None else 0.0)


def _label(replica: int | None) -> str:
    return "every replica" if replica is None else f"replica {replica}"


class ReplicaFaults:
    def __init__(self, runtimes: Callable[[], list], set_serving: Callable[[bool], Awaitable[None]],
                 restart: Callable[[int], Awaitable[None]] | None = None) -> None:
        """`runtimes()`: every replica's ModelRuntime now (`.replica`, `.core.slowdown`,
        `.pacer` freeze/thaw/poke); `restart(index)`: a crashed replica comes back."""
        self.runtimes = runtimes
        self._set_serving = set_serving
        self._restart = restart
        self.loop = asyncio.get_running_loop()
        self._targets: dict[int | None, _Target] = {None: _Target()}
        self._tasks: set[asyncio.Task] = set()

    def _target(self, replica: int | None) -> _Target:
        target = self._targets.get(replica)
        if target is None:
            target = self._targets[replica] = _Target()
        return target

    # ---- the faults ---------------------------------------------------------------------
    async def crash(self, replica: int | None = None) -> None:
        if replica is None or self._restart is None:
            log.error("crash fault injected: the engine exits with status %d in %.0f ms",
                      CRASH_EXIT_STATUS, CRASH_DELAY_S * 1000)
            self.loop.call_later(CRASH_DELAY_S, os._exit, CRASH_EXIT_STATUS)
            return
        log.error("crash fault injected: replica %d restarts (its requests in flight end)",
                  replica)
        await self._restart(replica)
        self.apply()

    def stall(self, seconds: float, replica: int | None = None) -> None:
        """Freeze for `seconds` from now (a stall in progress is extended or shortened)."""
        target = self._target(replica)
        if target.stall_timer is not None:
            target.stall_timer.cancel()
        elif replica is None:
            self._health(False)
        target.stall_until = self.loop.time() + seconds
        target.stall_timer = self.loop.call_later(seconds, self._end_stall, replica)
        self.apply()
        log.warning("stall fault injected: %s frozen for %.3f s", _label(replica), seconds)

    def _end_stall(self, replica: int | None) -> None:
        target = self._targets[replica]
        target.stall_timer = target.stall_until = None
        self.apply()
        if replica is None:
            self._health(True)
        log.warning("stall fault over: %s resumes", _label(replica))

    def slow(self, factor: float, seconds: float, replica: int | None = None) -> None:
        """Step times x `factor` for `seconds` (0: until cleared)."""
        target = self._target(replica)
        if target.slow_timer is not None:
            target.slow_timer.cancel()
            target.slow_timer = None
        target.slow_factor = factor
        target.slow_until = self.loop.time() + seconds if seconds > 0 else None
        if seconds > 0:
            target.slow_timer = self.loop.call_later(seconds, self._end_slow, replica)
        self.apply()
        log.warning("slow fault injected: %s, step times x %g for %s", _label(replica), factor,
                    f"{seconds:.3f} s" if seconds > 0 else "until cleared")

    def _end_slow(self, replica: int | None) -> None:
        target = self._targets[replica]
        target.slow_timer = target.slow_until = None
        target.slow_factor = 1.0
        self.apply()
        log.warning("slow fault over: %s, step times as modelled", _label(replica))

    def clear(self, replica: int | None = None) -> None:
        """End the target's stall and slowdown now; without a replica, every target's."""
        for key in list(self._targets) if replica is None else [replica]:
            target = self._targets.get(key)
            if target is None:
                continue
            if target.stall_timer is not None:
                target.stall_timer.cancel()
                self._end_stall(key)
            if target.slow_timer is not None:
                target.slow_timer.cancel()
            if target.slow_factor != 1.0 or target.slow_timer is not None:
                self._end_slow(key)

    # ---- state --------------------------------------------------------------------------
    def status(self, replica: int | None = None) -> FaultStatus:
        """The whole engine's faults, or one replica's in effect (its own and the whole
        engine's together)."""
        now = self.loop.time()
        engine = self._targets[None]
        stalled, slow_left = engine.left(now)
        factor = engine.slow_factor
        own = self._targets.get(replica) if replica is not None else None
        if own is not None:
            own_stalled, own_slow = own.left(now)
            stalled, slow_left = max(stalled, own_stalled), max(slow_left, own_slow)
            factor *= own.slow_factor
        return FaultStatus(stalled, factor, slow_left)

    @property
    def stalled(self) -> bool:
        return self._targets[None].stalled

    def apply(self, runtimes: list | None = None) -> None:
        """Bring each replica's pacer and step time in line with the faults in force (also
        for a replica added or restarted later)."""
        engine = self._targets[None]
        for rt in self.runtimes() if runtimes is None else runtimes:
            own = self._targets.get(rt.replica)
            if engine.stalled or (own is not None and own.stalled) or rt.paused == "keep":
                rt.pacer.freeze()  # (a replica paused with mode keep stays frozen too)
            else:
                rt.pacer.thaw()
            factor = engine.slow_factor * (own.slow_factor if own is not None else 1.0)
            if rt.core.slowdown != factor:
                rt.core.slowdown = factor
                rt.pacer.poke()

    def _health(self, serving: bool) -> None:
        task = self.loop.create_task(self._set_serving(serving))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
