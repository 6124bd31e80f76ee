"""One Session's way out: what is due to its client, gathered, and the writer that sends it.

Knows a Session's state on the engine's side (its open requests and arrivals not judged
yet, the events, token totals and queue states due to its client, its client's lateness)
and the writer loop: take the batch due, write it, time the write as the reader's
lateness, end on closing or at the end of input, and cancel what is still open on the way
out. Both transports use it: the gRPC stream (EngineService.Session) and the same-host
lane (engine.service.lane). Does not know how a client's messages are applied
(EngineService.session_actions) nor how requests are admitted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from inference_lab.engine.drivers.arrivals import Arrival
from inference_lab.engine.drivers.pacer import Stream
from inference_lab.engine.fleet.runtime import ModelRuntime
from inference_lab.engine.service.messages import finished_pb, queue_state_pb
from inference_lab.engine.sim.request import Request
from inference_lab.v1 import engine_pb2 as pb

if TYPE_CHECKING:
    from inference_lab.engine.service.rpc import EngineService

# A Session write that waits longer than this (wall s) means its reader (the gateway) is
# late (flow control); shorter waits count as none in the mean write wait.
WRITE_LATE = 0.0005
WAIT_WEIGHT = 1 / 8  # the mean write wait's weight of each new write


class SessionSink:
    """One Session: events, packed token progress and changed queue states gathered into
    one ProgressBatch per flush (at most one per pacer wake-up, plus admissions as they
    happen), and the writer that sends them (`serve`)."""

    def __init__(self, service: EngineService) -> None:
        self.service = service
        self.seen: dict[tuple[str, int], int] = {}  # (model, replica) -> queue_version announced
        self.seen_changes = -1  # service.queue_changes as of the last look at every replica
        self.events: list[pb.Progress] = []
        self.totals: dict[int, int] = {}  # tag -> tokens so far, latest wins
        self.open: dict[int, tuple[ModelRuntime, Request]] = {}
        self.pending: dict[int, Arrival | None] = {}  # tag -> an arrival not judged yet
        self.hold: float | None = None  # its client's hold (engine.service.holds)
        self.ready = asyncio.Event()
        self.closing = False  # the engine is stopping: end the call once flushed
        self.ended = asyncio.Event()
        self.same_clock = False  # the client reads this machine's clock: its stamps count
        self.finished_on: set[int] = set()  # replicas (engine labels) of the Finished queued:
        # the batch carries the metrics version, and their copies are pushed right behind
        self.lane = False  # over the Session lane: the batch carries those copies itself
        # How late its reader (the gateway) is: as it reports (SessionActions.relay_lag_s),
        # and the mean time a write waited for it (gRPC flow control).
        self.reported_lag = 0.0
        self.write_wait = 0.0
        self.input_ended = False  # the client sent its last message (or its input broke)
        self.failure: Exception | None = None  # why its input broke (a malformed message)

    def end_input(self, failure: Exception | None = None) -> None:
        """The client's messages ended (cleanly, or with `failure`): the writer decides."""
        self.input_ended = True
        if failure is not None and self.failure is None:
            self.failure = failure
        self.ready.set()

    def relay_lag(self) -> float:
        return max(self.reported_lag, self.write_wait)

    def on_tokens(self, stream: Stream, total: int) -> None:
        # Sequence i of a request with n > 1 reports under tag + i.
        self.totals[stream.tag + stream.index] = total  # while the writer is blocked, updates merge

    def on_finished(self, stream: Stream, req: Request) -> None:
        entry = self.open.pop(stream.tag, None) if req.all_finished else self.open.get(stream.tag)
        if entry is not None:
            self.finished_on.add(entry[0].metrics.engine)
        self.events.append(pb.Progress(tag=stream.tag + stream.index, finished=finished_pb(req)))

    def flush(self) -> None:
        self.ready.set()

    def take(self) -> pb.ProgressBatch | None:
        states = None
        changes = self.service.queue_changes
        if changes != self.seen_changes:  # some replica's queue state moved
            self.seen_changes = changes
            seen = self.seen
            for rt in self.service.fleet.runtimes():
                if seen.get(rt.key) != rt.queue_version:
                    seen[rt.key] = rt.queue_version
                    (states := states or []).append(queue_state_pb(rt, self.same_clock))
        if not (self.events or self.totals or states):
            return None
        totals = self.totals
        batch = pb.ProgressBatch(events=self.events, token_tags=totals.keys(),
                                 token_totals=totals.values(), queue_states=states,
                                 sent_monotonic_s=time.monotonic() if self.same_clock else None)
        self.events, self.totals = [], {}
        if self.finished_on:  # (their metrics were counted when they finished, before this)
            service = self.service
            if service.metrics is not None:
                batch.metrics_seq = service.metrics.versions.n
                # The copies: on the lane in this batch (its batches overtake the watch's
                # gRPC stream), else right behind it on every watch.
                if self.lane:
                    service.watchers.finished_on(
                        self.finished_on, batch.metrics,
                        share=any(not sink.lane for sink in service.sessions))
                else:
                    service.watchers.finished_on(self.finished_on, pb.MetricsPush())
            self.finished_on = set()
        return batch

    async def serve(self, write: Callable[[pb.ProgressBatch], Awaitable[None]]) -> None:
        """The writer of this Session: each batch due goes out through `write` (which
        returns once the transport took it: its wait is how late the reader is). Returns
        when the engine closes the Session or its input ended with nothing left to send;
        raises the input's failure (a malformed action). Every request still open is
        cancelled on the way out."""
        service = self.service
        clock = time.monotonic  # (not loop.time(): uvloop's counts whole ms)
        self.flush()  # the first batch announces every model's queue state
        service.sessions.add(self)
        try:
            while True:
                await self.ready.wait()
                self.ready.clear()
                batch = self.take()
                if batch is not None:
                    started = clock()
                    await write(batch)
                    waited = clock() - started  # > 0: the gateway reads late (flow control)
                    wait = self.write_wait
                    if waited > WRITE_LATE or wait:
                        wait += ((waited if waited > WRITE_LATE else 0.0) - wait) * WAIT_WEIGHT
                        self.write_wait = wait if wait > 1e-5 else 0.0
                        service.relay_changed()
                if self.closing:
                    return  # the engine is stopping: end the call with OK
                if self.input_ended and (self.failure is not None or
                                         not self.open and not self.events and not self.totals):
                    if self.failure is not None:
                        raise self.failure  # a malformed action ends the call now
                    return
        finally:
            service.sessions.discard(self)
            if self.relay_lag():
                service.relay_changed()  # its lateness leaves with it
            service.holds.set(self, None)  # and its hold
            self.ended.set()
            for arrival in self.pending.values():
                if arrival is not None:
                    arrival.withdrawn = True  # admitted later: cancelled at once
            self.pending.clear()
            for rt, req in list(self.open.values()):
                rt.pacer.cancel(req)
            self.open.clear()

