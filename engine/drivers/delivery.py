"""Delivery: the half of the pacer that hands each request's progress to its stream.

Knows the streams (sinks) waiting for a live request's tokens, what each has been handed,
the update interval `Cadence` (cadence.py) sets from the measured lateness, and the finish
each sink hears. Does not know when a step is booked or an arrival judged: the pacer
(pacer.py) books them and calls `_deliver` after every wake-up. Sinks are plain objects
with `on_tokens(stream, total)` / `on_finished(stream, request)` / `flush()`.

The rules it keeps (pacer.py's module text has them all): token counts handed out are
those of the last step that has ended (`due_mark`); one message per stream per wake-up;
a stream's first token is never held back, nor the token before its last, so that the
last goes alone with its completion.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from inference_lab.engine.drivers.cadence import Cadence
from inference_lab.engine.sim.core import EngineCore
from inference_lab.engine.sim.request import Request

log = logging.getLogger(__name__)


class Stream:
    """A delivery handle stored on Request.tag: where its progress goes. The sequences of
    a request with n > 1 share the sink and tag; `index` tells them apart."""

    __slots__ = ("sink", "tag", "index", "sent", "last")

    def __init__(self, sink, tag, index: int = 0) -> None:
        self.sink = sink
        self.tag = tag
        self.index = index
        self.sent = 0  # tokens already handed to the sink
        self.last = 0.0  # wall time (time.monotonic) of the last hand-over


class Delivery:
    """Mixed into the Pacer, whose loop owns the state below (`_start_delivery` sets it):
    the live requests by id, those finishing in the step in flight and those whose finish
    is due, and the progress mark and end of the last step that ended."""

    core: EngineCore
    monotonic: Callable[[], float]
    due_mark: int
    last_end: float

    def _start_delivery(self, *, on_lag, on_finished, on_change, on_cadence,
                        on_cadence_period, update_rate: float,
                        coalesce_when_late: bool) -> None:
        self.cadence = Cadence(update_rate, coalesce_when_late)
        self._interval = 0.0  # the update interval of the last delivery (wall s)
        self._logged = False  # coalescing's first engagement has been logged
        self._live: dict[int, Request] = {}  # requests with a stream, not yet finished
        self._finishing: list[Request] = []  # finish in the step in flight
        self._due_finished: list[Request] = []
        self._dirty_sinks: set = set()
        self._release = 0.0  # wall time at which the earliest held running stream may update
        self._on_lag = on_lag
        self._on_finished = on_finished
        self._on_change = on_change  # after every wake-up and cancel: the queue may have moved
        self._on_cadence = on_cadence  # (updates held back, interval) when either is news
        self._on_cadence_period = on_cadence_period  # (relay's mean lag, interval) per period

    def _delivered(self, req: Request, now: float) -> tuple[int, float]:
        """(tokens, sim time of the latest) of a live request as of the last step that
        ended: what a request ended early had really received."""
        if self.core.is_decoding(req):
            tokens = self.core.tokens_at(req, self.due_mark)
            return tokens, (self.last_end if tokens > 1 else req.first_token if tokens else -1.0)
        if not 0 <= req.first_token <= now:
            return 0, -1.0  # no token yet (or only in the step in flight)
        # Preempted, or prefilling again after a preemption: its tokens so far had all
        # ended by the start of the step that preempted it.
        tokens = req.num_output
        return tokens, (req.preempted_at if tokens > 1 and req.preempted_at > 0 else req.first_token)

    def relay_lateness(self, seconds: float) -> None:
        """The process relaying the tokens (a Session's reader: the gateway) is `seconds`
        late now: lateness as much as the pacer's own (Cadence.on_relay)."""
        self.cadence.on_relay(seconds)

    def _observe_lag(self, lag: float) -> None:
        if self._on_lag:
            self._on_lag(lag)
        self._cadence_lag(lag)

    def _cadence_lag(self, lag: float) -> None:
        cadence = self.cadence
        changed = cadence.on_lag(lag, self.monotonic())
        if cadence.judged is not None and self._on_cadence_period:
            self._on_cadence_period(cadence.judged, cadence.current)
        if changed:
            if cadence.engaged and not self._logged:
                self._logged = True
                log.warning("%s: late by %.1f ms (pacer wake-ups %.1f ms on average, the "
                            "gateway relaying tokens %.1f ms): mid-stream tokens now grouped (at "
                            "least %.0f ms between a stream's updates, as little as keeps up) "
                            "until it catches up; logged once, see "
                            "inference_lab_stream_update_interval_seconds",
                            self.core.name, cadence.lateness * 1e3, cadence.mean_lag * 1e3,
                            cadence.relay * 1e3, cadence.current * 1e3)
            if self._on_cadence:
                self._on_cadence(0, cadence.current)

    def _deliver(self) -> None:
        """Hand each stream its due tokens (one message per stream), then due finishes."""
        core = self.core
        mark = self.due_mark
        dirty = self._dirty_sinks
        now = self.monotonic()
        interval = self._interval = self.cadence.interval(len(self._live))
        held_since = now - interval
        earliest = now  # the oldest last update among running streams
        held = 0
        # Newest first: the requests whose first token this is (admitted last) lead the
        # batch, so their readers are woken first (TTFT is what the lab's hop adds to most).
        for req in reversed(self._live.values()):
            stream = req.tag
            due = core.tokens_at(req, mark)
            if due > stream.sent:
                if stream.sent == 0 or stream.last <= held_since:
                    stream.sent = due
                    stream.last = now
                    stream.sink.on_tokens(stream, due)
                    dirty.add(stream.sink)
                    continue
                held += 1
            if stream.last < earliest and core.is_decoding(req):
                earliest = stream.last
        self._release = earliest + interval
        if held and self._on_cadence:
            self._on_cadence(held, interval)
        for req in self._finishing:  # its last token belongs to the step in flight: the
            stream = req.tag  # ones before it go now, so that the last goes alone
            due = core.tokens_at(req, mark)
            if due > stream.sent:
                stream.sent = due
                stream.last = now
                stream.sink.on_tokens(stream, due)
                dirty.add(stream.sink)
        if self._due_finished:
            for req in self._due_finished:
                self._finish(req)
            self._due_finished.clear()
        self._flush()

    def _finish(self, req: Request, ended: tuple[int, float] | None = None) -> None:
        """Deliver a finish: `ended` (tokens, time of the latest) for one ended early,
        else it completed with all its tokens at its finish time."""
        stream = req.tag
        total = self.core.tokens_of(req)
        if total > stream.sent:
            stream.sent = total
            stream.sink.on_tokens(stream, total)
        stream.sink.on_finished(stream, req)
        self._dirty_sinks.add(stream.sink)
        if self._on_finished:
            self._on_finished(req, *(ended or (total, req.finish_time)))

    def _flush(self) -> None:
        if self._on_change:
            self._on_change()
        for sink in self._dirty_sinks:
            sink.flush()
        self._dirty_sinks.clear()
