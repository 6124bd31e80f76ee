"""The runner's open loop (experiments.runner.Runner mixes it in): Poisson arrivals at the
current rate or its schedule, or a trace's own instants, each sent from a timer callback
at its scheduled instant on an idle keep-alive connection of the replica it is routed to,
and settled in the connection's callback.

Knows the rate, the rate schedule (by thinning) and the trace's instants, the pooled
connections. Does not know how a request is built or recorded (experiments.load).
"""

from __future__ import annotations

import asyncio

from inference_lab.experiments.client import Connection, Result
from inference_lab.experiments.load import STATUS_NO_RESPONSE

__all__ = ["OpenLoopSide"]

OPEN_LOOP_POOL = 64  # keep-alive connections opened before an open loop starts


class OpenLoopSide:
    """The open loop's half of the Runner (its attributes are set in Runner.__init__)."""

    async def _open_loop(self) -> None:
        """Open-loop arrivals (Poisson at the current rate or its schedule, or a trace's
        own instants), sent from a timer callback at each one's scheduled instant; its send
        delay counts from there (no coordinated omission: a late wake-up sends every
        arrival already due, each with its own delay). Requests go out on idle keep-alive
        connections to the replica they are routed to (a new one only when all of that
        replica's are busy) and end in the connection's callback: no task, future or
        closure per request."""
        per_route = max(OPEN_LOOP_POOL // max(len(self._ready), 1), 8)
        for route in self._ready:
            conns = await asyncio.gather(*(route.endpoint.connect() for _ in range(per_route)),
                                         return_exceptions=True)
            route.idle.extend(c for c in conns if not isinstance(c, BaseException))
        self._open_ended = self.loop.create_future()
        self._timer = self.backend.timer(self.loop, self._tick)
        self._peak = _peak_rate(self.schedule) if self.schedule is not None else 0.0
        try:
            self._due = self.clock()
            self._schedule()
            await self._open_ended
        finally:
            self._timer.close()

    def _next_due(self) -> float | None:
        """The next arrival's clock time (None: the trace has ended), or the instant to
        look at a zero rate again."""
        k = self.k
        if self.trace is not None:
            i = self._trace_i
            if i >= self._trace_n:
                return None
            self._idle_rate = False
            return self.t0 + self.trace.times[i] / k
        if self.schedule is not None:  # thinning: candidates at the peak rate, kept at rate(t) / peak
            peak, due = self._peak, self._due
            if peak <= 0:
                self._idle_rate = True
                return due + 0.01
            self._idle_rate = False
            while True:
                due += self.rng.expovariate(peak) / k
                if due >= self.end or self.rng.random() * peak <= self.schedule.rate_at((due - self.t0) * k):
                    return due
        if self.rate <= 0:
            self._idle_rate = True
            return self.clock() + 0.01
        self._idle_rate = False
        return self._due + self.rng.expovariate(self.rate) / k

    def _schedule(self) -> None:
        """Arm the timer for the next arrival (or to look at a zero rate again in 10 ms)."""
        due = self._next_due()
        if due is None or due >= self.end:
            if not self._open_ended.done():
                self._open_ended.set_result(None)
            return
        self._due = due
        self._timer.arm(due)

    def _tick(self) -> None:
        now = self.clock()
        while True:
            if not self._idle_rate:
                self._arrive(self._due, now)
            self._schedule()
            if self._due > now or self._open_ended.done():
                return
            now = self.clock()

    def _arrive(self, due: float, now: float) -> None:
        ctl = self.ctl
        ticket = ctl.acquire((now - self.t0) * self.k)
        if ticket is None:
            self.records.shed(due, self.phase, ctl.limit, ctl.inflight)
            if self.trace is not None:
                self._trace_i += 1  # that request of the trace was shed
            return
        limit, inflight = ctl.limit, ctl.inflight
        self.records.controller(now, limit, inflight)
        route = self._route()
        self.front_requests += 1
        if route is None:
            _, prompt, output = self._request(-1, self.endpoint)
            result = self._unrouted()
            self._release(ticket, result)
            self.records.request(due, -1, self.phase, limit, inflight, prompt, output, result)
            return
        raw, prompt, output = self._request(-1, route.endpoint)
        context = (due, ticket, self.phase, limit, inflight, prompt, output, route)
        if self.pd is not None:  # two hops: a task each
            self._pending += 1
            task = self.loop.create_task(self._pd_request(raw, context))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        idle = route.idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                self._pending += 1
                conn.start(raw, self._open_done, context)
                return
        self._pending += 1
        task = self.loop.create_task(self._open_request(raw, context))
        self._tasks.add(task)  # all busy: connect
        task.add_done_callback(self._tasks.discard)

    def _open_done(self, conn: Connection, result: Result) -> None:
        due, ticket, phase, limit, inflight, prompt, output, route = conn.ctx
        conn.ctx = None
        if not conn.closed:
            route.idle.append(conn)
        if self.fleet is not None:
            result.replica = route.index
        self._settled(due, ticket, phase, limit, inflight, prompt, output, result)

    def _settled(self, due, ticket, phase, limit, inflight, prompt, output, result: Result) -> None:
        self._pending -= 1
        self._release(ticket, result)
        self.records.request(due, -1, phase, limit, inflight, prompt, output, result)
        if self._pending == 0 and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def _pd_request(self, raw, context: tuple) -> None:
        self._settled(*context[:-1], await self.pd.send(raw))

    async def _open_request(self, raw, context: tuple) -> None:
        """An arrival with every pooled connection of its replica busy: a new connection,
        kept after."""
        route = context[-1]
        try:
            conn = await route.endpoint.connect()
        except OSError as exc:
            now = self.clock()
            self._settled(*context[:-1], Result(STATUS_NO_RESPONSE, now, 0.0, now, error=str(exc)[:300]))
            return
        conn.start(raw, self._open_done, context)


def _peak_rate(schedule) -> float:
    """The highest rate a rate_schedule reaches (for thinning)."""
    if schedule.type == "sine":
        return max(schedule.low, schedule.high)
    if schedule.type == "square":
        return max(schedule.low, schedule.high)
    return max(rate for _, rate in schedule.points)
