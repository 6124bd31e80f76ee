"""The runner's load through the controller (experiments.runner.Runner mixes it in):
closed-loop users, each sending its next request when the last one ends, a slot from the
controller first (waiting for a release, or for a limit that grew); each request built
from the workload (or the trace), routed, sent and recorded, and its response the
controller's sample.

Knows the controller interface, the workload's lengths and the trace, the route of a
request (a fleet's, a P/D router's, or the base port). Does not know the open loop's
timing (experiments.open_loop) or the control plane.
"""

from __future__ import annotations

import asyncio
import math

from inference_lab.experiments.client import ConnectionError_, Result
from inference_lab.experiments.controllers import Outcome
from inference_lab.experiments.outcomes import is_refusal
from inference_lab.experiments.prompts import Prompt

__all__ = ["LoadSide", "SHED", "STATUS_NO_RESPONSE", "STATUS_SHED", "STATUS_UNROUTED"]

SLOT_RECHECK = 0.1  # modelled seconds: a waiting user re-checks a limit that grew with no release
SHED_PAUSE = 0.01  # modelled seconds: at least this long before a user shed on the client tries again
STATUS_UNROUTED = 503  # no replica was ready: the front answered for the fleet
STATUS_SHED = 0  # refused by the client's own controller, never sent
STATUS_NO_RESPONSE = -1
SHED = object()  # _acquire_blocking: the controller refused outright (no slot to wait for)


class LoadSide:
    """The load's half of the Runner (its attributes are set in Runner.__init__)."""

    # ---- the controller's slots -------------------------------------------------------------
    def _trace(self, wall: float) -> None:
        self.records.controller(wall, self.ctl.limit, self.ctl.inflight)

    def _wake(self) -> None:
        """Wake as many waiting users as the controller has free slots (at least one; a
        user that finds none waits again). A limit that grows without a release (Envoy's
        time windows) is seen at the waiters' SLOT_RECHECK instead."""
        free, woke = self.ctl.limit - self.ctl.inflight, 0
        while self._slot_waiters and (woke < free or not woke):
            fut = self._slot_waiters.pop(0)
            if not fut.done():
                fut.set_result(None)
                woke += 1

    async def _acquire_blocking(self):
        """A slot for a closed-loop user: wait for a release (or a limit that grew)."""
        while True:
            wall = self.clock()
            ticket = self.ctl.acquire((wall - self.t0) * self.k)
            if ticket is not None:
                self._trace(wall)
                return ticket
            if self.clock() >= self.end:
                return None
            if self.ctl.limit == math.inf:
                return SHED  # refused on the client without a limit to wait under (sre)
            fut = self.loop.create_future()
            self._slot_waiters.append(fut)
            try:
                async with asyncio.timeout(SLOT_RECHECK / self.k):
                    await fut
            except TimeoutError:
                pass

    def _release(self, ticket, result: Result) -> None:
        """The controller's sample from one response (`result.done`: when it ended)."""
        k, status = self.k, result.status
        if status == 200:
            outcome = Outcome.OK
            if self.rtt_e2e or not result.first:
                rtt = (result.done - result.sent) * k
            elif self.sc.rtt == "ttft":
                rtt = (result.first - result.sent) * k
            elif result.completion_tokens > 1:  # per_token
                rtt = (result.done - result.first) * k / (result.completion_tokens - 1)
            else:
                rtt = (result.done - result.sent) * k
        elif is_refusal(status, result.error):  # a 529; SGLang's queue-full 503
            outcome, rtt = Outcome.DROPPED, (result.done - result.sent) * k
        elif status == STATUS_NO_RESPONSE:
            outcome, rtt = Outcome.IGNORED, 0.0
        else:
            outcome, rtt = Outcome.IGNORED, (result.done - result.sent) * k
        self.ctl.release(ticket, (result.done - self.t0) * k, outcome, rtt)
        self.records.controller(result.done, self.ctl.limit, self.ctl.inflight)
        if self._slot_waiters:
            self._wake()

    # ---- one request ------------------------------------------------------------------------
    def _request(self, user: int, endpoint) -> tuple[object, Prompt, int]:
        """The next request of `user` (-1: an open-loop arrival) for `endpoint`: what it
        sends (bytes, or a virtual lab's job), its prompt and its output length."""
        wl, trace = self.sc.workload, self.trace
        if trace is not None:
            i = self._trace_i
            self._trace_i += 1
            output = trace.outputs[i]
            prompt = self.prompts.of_ids(trace.prompt_ids(i, wl.seed) if trace.has_blocks else b"",
                                         trace.inputs[i])
        else:
            input_len = wl.input_len_dist.sample(self.rng)
            output = 0 if wl.pooling else wl.output_len_dist.sample(self.rng)  # (embeddings)
            prompt = self.prompts.next(user, input_len, output)
        self._serial += 1
        return endpoint.build(prompt, output, self._serial), prompt, output

    def _unrouted(self) -> Result:
        now = self.clock()
        self.front_unrouted += 1
        return Result(STATUS_UNROUTED, now, 0.0, now, error="no ready replica")

    async def _one(self, conns: dict, due: float, user: int, ticket) -> Result:
        """Send one request (on the user's connection to the replica it goes to, or a new
        one) and record it."""
        limit, inflight, phase = self.ctl.limit, self.ctl.inflight, self.phase
        route = self._route()
        self.front_requests += 1
        if route is None:
            raw, prompt, output = self._request(user, self.endpoint)
            result = self._unrouted()
        elif self.pd is not None:
            raw, prompt, output = self._request(user, route.endpoint)
            result = await self.pd.send(raw)
        else:
            raw, prompt, output = self._request(user, route.endpoint)
            conn = conns.get(route.port)
            try:
                if conn is None or conn.closed:
                    conn = conns[route.port] = await route.endpoint.connect()
                result = await conn.send(raw)
            except (OSError, ConnectionError_) as exc:
                now = self.clock()
                result = Result(STATUS_NO_RESPONSE, now, 0.0, now, error=str(exc)[:300])
                if conn is not None:
                    conn.close()
                conns.pop(route.port, None)
            if self.fleet is not None:
                result.replica = route.index
        self._release(ticket, result)
        self.records.request(due, user, phase, limit, inflight, prompt, output, result)
        return result

    # ---- closed-loop users ------------------------------------------------------------------
    async def _user(self, i: int) -> None:
        conns: dict = {}
        try:
            while self.clock() < self.end:
                if i >= self.users_target:
                    await asyncio.sleep(0.05 / self.k + 0.001)  # parked by a load change
                    continue
                due = self.clock()
                ticket = await self._acquire_blocking()
                if ticket is None:
                    break
                if ticket is SHED:  # recorded like a refusal, then the user pauses as after one
                    self.records.shed(due, self.phase, self.ctl.limit, self.ctl.inflight)
                    await asyncio.sleep(max(self.sc.retry_after_529, SHED_PAUSE) / self.k)
                    continue
                if i >= self.users_target:  # parked while it waited
                    self.ctl.release(ticket, self.now(), Outcome.IGNORED, 0.0)
                    self._wake()
                    continue
                result = await self._one(conns, due, i, ticket)
                if result.status != 200 and self.sc.retry_after_529 > 0:
                    await asyncio.sleep(self.sc.retry_after_529 / self.k)
        finally:
            for conn in conns.values():
                conn.close()

    def _ensure_users(self) -> None:
        while len(self._users) < self.users_target:
            self._users.append(self.loop.create_task(self._user(len(self._users))))
