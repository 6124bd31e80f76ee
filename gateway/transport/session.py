"""The Session's logic that both transports share: routes, outbox, dispatch of batches.

Knows: one live Session with the engine (`Session`): its routes (tag -> the request's
stream, gateway.streams), the actions it sends (Open, Cancel, Refused), the message that
carries them (`_message`: with a due lateness report and the hold when it moved), the
dispatch of each ProgressBatch to its streams (`_on_batch`: synchronously, as it is read;
first tokens at once, the others relayed after the tasks the batch woke), the engine's
queue states (the admission copy, gateway.admission) and how late this gateway reads the
engine's batches. A transport (gateway.transport.grpc_session, gateway.transport.lane)
delivers each batch to `_on_batch`, sends what `_message` builds, and sets `task`.

How late: this gateway's time.monotonic() as it takes a batch minus the engine's
ProgressBatch.sent_monotonic_s, the least over each LAG_WINDOW_S (a gateway that is behind
reads every batch late; one busy moment, such as writing one large batch, delays only a
few). Reported to the engine (SessionActions.relay_lag_s) while above LAG_REPORT, and once
more when back under: the engine's cadence groups mid-stream tokens once that lasts
(engine.drivers.cadence).

The hold: the requests this gateway has read and not yet sent (gateway.backlog) bound how
far the engine may decide its modelled queue: each message says the oldest one's stamp
(`SessionActions.hold_s`, 0 when none).

Does not know: the channel or how a Session is chosen and reopened (gateway.channel), HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from inference_lab.gateway.admission import AdmissionCopy
from inference_lab.gateway.backlog import Backlog
from inference_lab.gateway.errors import engine_unavailable
from inference_lab.gateway.streams import Route, relay_all
from inference_lab.v1 import engine_pb2 as pb

# The engine client's one logger (gateway.engine_client and the modules it is made of).
log = logging.getLogger("inference_lab.gateway.engine_client")

LAG_REPORT = 0.0005  # read lateness reported to the engine while above this (s)
LAG_WINDOW_S = 0.01  # ... taken as the least over each window this long
LAG_DUE = pb.SessionAction()  # an outbox marker: a lateness report is due
HOLD_DUE = pb.SessionAction()  # an outbox marker: the hold may have moved


class Probe:
    """An observer of the Session pipe (EngineClient(probe=...)), for diagnostics such as
    benchmarks/session_pipe.py: called per message, never per token, and not at all when
    no probe is given. Subclass and override what you need; every hook runs on the
    event loop and must not block."""

    def on_open(self, tag: int) -> None:
        """A request is about to be sent with this tag (its sequences: tag .. tag + n - 1)."""

    def on_send(self, action: pb.SessionAction) -> None:
        """An action was queued in the Session's outbox."""

    def on_message(self, actions: list[pb.SessionAction]) -> None:
        """These queued actions leave in one SessionActions message."""

    def on_batch(self, batch: pb.ProgressBatch) -> None:
        """A ProgressBatch arrived (before its events reach their streams)."""


class Session:
    """One live Session (over gRPC or the lane): its routes (tag -> stream), outbox and the
    dispatch of the engine's batches. A transport subclass delivers each ProgressBatch to
    `_on_batch`, sends what `_message` builds, and sets `task` (which ends with it)."""

    transport = ""  # "grpc" or "lane", for logs and tests

    def __init__(self, on_broken: Callable[["Session"], None],
                 probe: Probe | None = None, backlog: Backlog | None = None) -> None:
        self.routes: dict[int, Route] = {}
        self.backlog = backlog if backlog is not None else Backlog()
        self._hold_sent = 0.0  # the hold last told the engine (0: none)
        self.broken = False
        self._loop = asyncio.get_running_loop()
        # The engine's word on which queues are full, and the refusals made on it
        self.admission = AdmissionCopy(self.send, self._loop)
        # replica -> the engine's metrics version once its last Finished delivered here was
        # counted (ProgressBatch.metrics_seq): a /metrics copy at least that new shows it
        self.finished_seq: dict[int, int] = {}
        # A batch's own copies of those replicas' series (ProgressBatch.metrics, over the
        # lane) go here: MetricsFeed.take
        self.on_metrics: Callable[[pb.MetricsPush], None] | None = None
        self.read_lag = 0.0  # how late batches were read here, the least over a window (s)
        self._lag_least = float("inf")  # over the current window
        self._lag_next = 0.0  # time.monotonic() at which the current window ends
        self._lag_report: float | None = None  # due in the next message
        self._on_broken = on_broken
        self._probe = probe
        self.task: asyncio.Task[None] | None = None
        # batches whose mid-stream tokens are still being written (a relay takes several
        # loop iterations at more than RELAY_CHUNK streams, and the next batch can come
        # in meanwhile)
        self._relaying = 0

    def _relayed(self) -> None:
        """A batch's mid-stream tokens are all written (a transport's hook)."""
        self._relaying -= 1

    def send(self, action: pb.SessionAction) -> None:
        self._post(action)
        if self._probe is not None:
            self._probe.on_send(action)

    def _post(self, item: pb.SessionAction | None) -> None:
        """Queue an action (or LAG_DUE, or None: the end) for the transport."""
        raise NotImplementedError

    def _stop(self) -> None:
        """End the transport (the Session is closed)."""
        raise NotImplementedError

    @property
    def saturated(self) -> dict[str, pb.QueueState]:
        """queue_key(model, replica) -> the engine's last "full" QueueState with a span."""
        return self.admission.saturated

    def _read_late(self, sent: float) -> None:
        """A batch the engine wrote at `sent` (its time.monotonic(), our clock) is read
        now: the window's least lag; at the window's end, a report when due."""
        now = time.monotonic()
        lag = now - sent
        if lag < self._lag_least:
            self._lag_least = lag
        if now >= self._lag_next:
            told, lag = self.read_lag, self._lag_least
            self.read_lag, self._lag_least = lag, float("inf")
            self._lag_next = now + LAG_WINDOW_S
            if lag > LAG_REPORT or told > LAG_REPORT:
                self._lag_report = lag
                self._post(LAG_DUE)

    def hold_moved(self, first: bool) -> None:
        """The backlog's oldest stamp moved (`first`: it was empty): tell the engine with
        the next message."""
        self._post(HOLD_DUE)

    def _message(self, actions: list[pb.SessionAction]) -> pb.SessionActions | None:
        """The message carrying these queued actions, a due lateness report and the hold
        when it moved (None when there is none of them)."""
        message = pb.SessionActions(actions=actions)
        hold = self.backlog.oldest() or 0.0  # (after these actions: their requests are sent)
        news = False
        if hold != self._hold_sent:
            message.hold_s = self._hold_sent = hold
            news = True
        if self._lag_report is not None:
            message.relay_lag_s, self._lag_report = self._lag_report, None
        elif not actions and not news:
            return None
        if self._probe is not None:
            self._probe.on_message(actions)
        return message

    def _on_batch(self, batch: pb.ProgressBatch) -> None:
        """One ProgressBatch to its requests' streams (synchronously, as it is read)."""
        probe = self._probe
        if probe is not None:
            probe.on_batch(batch)
        if batch.HasField("sent_monotonic_s"):  # (an engine on our clock)
            self._read_late(batch.sent_monotonic_s)
        admission = self.admission
        for state in batch.queue_states:  # before any event: a client that
            admission.set(state)  # hears of a finish sees the queue after it
        routes = self.routes
        finals = []
        for event in batch.events:
            kind = event.WhichOneof("event")
            if kind == "admitted":
                stream = routes.get(event.tag)
                if stream is not None:  # else cancelled or unknown: ignore
                    stream.deliver(event)
            elif kind == "tokens":
                stream = routes.get(event.tag)
                if stream is not None:
                    stream.progress(event.tokens.total_tokens)
            elif kind is not None:
                finals.append(event)
        for event in finals:  # a stream's last tokens go out with its closing,
            stream = routes.get(event.tag)  # in one write by its handler
            if stream is not None and stream.writer is not None:
                stream.writer = None
        # Packed token progress: tag i has generated totals[i] tokens so far. A
        # stream with a writer is written here if these are its first tokens (they
        # lead the batch: TTFT), else after the tasks this batch wakes.
        relayed = []
        for tag, total in zip(batch.token_tags, batch.token_totals):
            stream = routes.get(tag)
            if stream is not None:
                if stream.writer is not None and total > stream.total:
                    first = not stream.total
                    stream.total = total
                    if first:
                        stream.relay()
                    else:
                        relayed.append(stream)
                else:
                    stream.progress(total)
        if relayed:
            self._relaying += 1
            self._loop.call_soon(relay_all, relayed, 0, self._relayed)
        seq = batch.metrics_seq  # set when the batch finishes requests
        if seq and self.on_metrics is not None and batch.HasField("metrics"):
            self.on_metrics(batch.metrics)  # (lane) the copies, before anyone hears of it
        for event in finals:  # finished or rejected: the last event of its tag
            stream = routes.pop(event.tag, None)
            if stream is not None:
                if seq:  # before the client can hear of it (and scrape)
                    self.finished_seq[stream.replica] = seq
                stream.deliver_last(event)
                if event.HasField("rejected"):  # (on a request's own tag only)
                    for tag in range(stream.tag + 1, stream.tag + stream.n):
                        routes.pop(tag, None)  # its other sequences' tags

    def close(self, reason: str, shutdown: bool = False) -> None:
        """Fail every request in flight and stop; idempotent."""
        if self.broken:
            return
        self.broken = True
        self.admission.close()
        routes, self.routes = self.routes, {}
        err = engine_unavailable(reason)
        for stream in routes.values():
            stream.fail(err)
        self._stop()
        level = logging.INFO if shutdown else logging.WARNING
        log.log(level, "engine session closed (%d requests in flight failed): %s",
                len(routes), reason)
        self._on_broken(self)
