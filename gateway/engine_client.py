"""The gateway's one connection to the engine: a grpc.aio channel and ONE Session stream.

The Session runs over the engine's same-host lane (gateway.session_lane: a plain socket,
the same messages, no grpc.aio per message) when the engine offers one on this host, else
over gRPC; `_Session` is the logic both share, `_GrpcSession` and `_LaneSession` the two
transports (docs/architecture.md, "The Session lane").

Knows: the engine's gRPC API (engine.proto). Every HTTP request travels over a single
multiplexed bidirectional `Session`: `open()` sends `Open(tag, request)` with a
gateway-unique tag and returns a `RequestStream`; one dispatcher task reads the engine's
`ProgressBatch`es and hands each `Progress` to its request's stream (a list plus a future,
cheaper than an asyncio.Queue). `cancel()` sends `Cancel(tag)`. Unary wrappers cover
ListModels (cached; refreshed on reconnect and on an unknown model), GetCapacity and
SetCapacity (with the control token as `authorization` metadata when one is set), and the
engine's gRPC health (`serving()`: NOT_SERVING while it drains for shutdown).

Refusals without a round trip, only where they are the engine's own answer: the engine
announces on the Session whenever a model's queue becomes full or stops being full
(`QueueState`, with the refusal's text), and while full the span of arrival instants over
which it provably stays full (from when it filled to the end of the step in flight: the
queue's fullness changes only at step boundaries and by arrivals, engine.sim.core
`saturation`). `open()` refuses at once with QUEUE_SATURATED and the engine's text a
request whose arrival stamp lies in that span (a request too large for the model, by the
engine's own `max_request_tokens`, still goes: the engine answers it with a 400), and
reports the count back (`Refused`, batched every REFUSED_REPORT_S) so the engine's
rejection metrics still count every refusal. Every other request goes to the engine,
which judges it at its arrival instant. A capacity change made through this client
(`set_capacity`) applies the engine's "not full" reply at once.

The hold: the requests this gateway has read and not yet sent (`backlog`,
gateway.backlog) bound how far the engine may decide its modelled queue: each message says
the oldest one's stamp (`SessionActions.hold_s`, 0 when none), the first at once.

Failure policy: nothing waits for the engine forever. Calls use wait_for_ready=False and
short deadlines, so a new request learns "engine unavailable" within ~1 s. When the Session
breaks (engine gone, stream closed) every request in flight fails with engine_unavailable
(the engine itself cancels them when the stream drops) and the channel is marked stale; the
next request builds a fresh channel and Session (lazy reconnect, no reconnect backoff to
wait out), so a restarted engine is served again without restarting the gateway.

Does not know: HTTP, OpenAI shapes, token counting, or what the tokens mean.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Sequence
from typing import Any, Awaitable, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inference_lab.common.clock import CLOCK_METADATA, clock_id
from inference_lab.common.tokenizer import ids_to_bytes
from inference_lab.gateway.backlog import Backlog
from inference_lab.gateway.errors import ErrorKind, GatewayError, engine_unavailable, from_grpc_error
from inference_lab.gateway.metrics_feed import MetricsFeed
from inference_lab.gateway.session_lane import LaneLink, LaneUnavailable, connect_lane
from inference_lab.v1 import engine_pb2 as pb
from inference_lab.v1 import engine_pb2_grpc as pb_grpc

log = logging.getLogger("inference_lab.gateway.engine_client")

CHANNEL_OPTIONS = (
    # A fresh channel must really reconnect: without a local pool, gRPC core shares one
    # subchannel per target across channels, still sitting out its reconnect backoff.
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    # No BDP probing: the flow-control window must stay small, so that a gateway that
    # falls behind pushes back on the engine (which then merges each stream's tokens into
    # fewer, larger updates) instead of gRPC buffering seconds of per-step batches.
    ("grpc.http2.bdp_probe", 0),
    # ... and small means small: gRPC's default window of 64 KB holds ~60 batches of 256
    # streams (~100 ms of steps) before the engine's write waits, so a gateway that cannot
    # keep up reads tokens 100 ms late while the engine sees no lateness. With 1 KB the
    # engine waits (and merges) once the gateway is a few batches behind; 24-64 streams'
    # batches (~100-300 bytes) still never wait (BENCHMARKS.md, "Stream cadence").
    ("grpc.http2.lookahead_bytes", 1024),
)
# Scrapes of /metrics (~140 KB per replica) go over a connection of their own: on the
# Session's, a response waits behind the token batches the gateway has not read yet (its
# flow-control window is small on purpose, and shared by every stream of the connection).
# Its window takes a whole push of every replica's series (~1.2 MB for 8) at once: a
# message larger than the window waits for window updates, a round trip each between two
# busy processes.
SCRAPE_CHANNEL_OPTIONS = tuple(o for o in CHANNEL_OPTIONS
                               if o[0] not in ("grpc.http2.bdp_probe", "grpc.http2.lookahead_bytes")
                               ) + (("grpc.http2.lookahead_bytes", 16 * 1024 * 1024),)
REFUSED_REPORT_S = 0.01  # refusals made here reach the engine's metrics within this
# How late this gateway reads the engine's batches: its time.monotonic() as the
# dispatcher takes a batch minus the engine's ProgressBatch.sent_monotonic_s, the least
# over each LAG_WINDOW_S (a gateway that is behind reads every batch late; one busy
# moment, such as writing one large batch, delays only a few). Reported to the engine
# (SessionActions.relay_lag_s) while above LAG_REPORT, and once more when back under:
# the engine's cadence groups mid-stream tokens once that lasts (engine.drivers.cadence).
LAG_REPORT = 0.0005
LAG_WINDOW_S = 0.01
_LAG_REPORT = pb.SessionAction()  # an outbox marker: a lateness report is due
_HOLD_REPORT = pb.SessionAction()  # an outbox marker: the hold may have moved
SESSION_LANE_ENV = "INFERENCE_LAB_SESSION_LANE"  # the gateway's --session-lane default
SESSION_LANE_MODES = ("auto", "off")
_NAME_SHOWN = 200  # an unknown model's name is echoed up to this many characters
_MODEL_REFRESH_MIN_INTERVAL_S = 1.0  # an unknown model name refreshes the cache at most this often
_ENGINE_SERVICE = pb.DESCRIPTOR.services_by_name["Engine"].full_name


def queue_key(model: str, replica: int = 0) -> str:
    """Whose queue state: the model's name for replica 0, `model@i` for replica i."""
    return f"{model}@{replica}" if replica else model


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


class ClientGone(Exception):
    """The HTTP client went away; its engine request has been cancelled."""


class RequestStream:
    """The receiving end of one request (filled by the dispatcher): its Admitted,
    Finished or Rejected events, and `total`, the tokens the engine has announced so far
    (token progress is a number, not a list of events: the hot path only moves an int).

    `done` is True once no Cancel is needed any more: the engine finished or rejected it,
    the Session broke (the engine cancels on its side), or it was cancelled already.
    """

    __slots__ = ("tag", "model", "key", "replica", "n", "done", "total", "totals", "writer",
                 "_finals", "_taken", "_events", "_waiter", "_error", "_loop")

    def __init__(self, tag: int, loop: asyncio.AbstractEventLoop, model: str = "",
                 n: int = 1, replica: int = 0) -> None:
        self.tag = tag
        self.model = model
        self.key = queue_key(model, replica)  # whose queue state it reads
        self.replica = replica
        self.n = n  # sequences: sequence i reports under tag + i
        self.done = False
        self.total = 0  # tokens announced by the engine so far (every sequence's)
        self.totals: list[int] | None = [0] * n if n > 1 else None  # per sequence, n > 1
        # Set by a handler that can take new tokens synchronously (n == 1): called with the
        # new total (`_relay`, after the batch's woken tasks) instead of waking the
        # handler's task; returns False when it could not write (the task is woken then).
        self.writer: Callable[[int], bool] | None = None
        self._finals = 0  # Finished events received (one per sequence)
        self._taken = 0  # `total` as of the last next_events()
        self._events: list[pb.Progress] = []
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._loop = loop

    def _push(self, event: pb.Progress) -> None:
        self._events.append(event)
        self._wake()

    def _final(self, event: pb.Progress) -> None:
        """A Finished (one per sequence) or a Rejected: the last event of its tag."""
        self._finals += 1
        if self._finals >= self.n or event.HasField("rejected"):
            self.done = True
        self._push(event)

    def _tokens(self, total: int) -> None:
        if self.totals is not None:
            self._seq_tokens(0, total)
        elif total > self.total:
            self.total = total
            self._wake()

    def _relay(self) -> None:
        """Hand `total` to the writer (the dispatcher's relay), else wake the task."""
        writer = self.writer
        if writer is not None and not self._events and writer(self.total):
            self._taken = self.total  # written: nothing for the task to do
        else:
            self._wake()

    def _seq_tokens(self, index: int, total: int) -> None:
        old = self.totals[index]
        if total > old:
            self.totals[index] = total
            self.total += total - old
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        self.done = True
        if self._error is None:
            self._error = exc
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def ready(self) -> bool:
        """`next_events()` would return (or raise) without waiting."""
        return bool(self._events) or self.total != self._taken or self._error is not None

    async def next_events(self) -> list[pb.Progress]:
        """Every event received since the last call, returning once there is an event or
        `total` has grown; what arrived before a failure is delivered first, then the
        failure is raised."""
        while not self._events and self.total == self._taken:
            if self._error is not None:
                raise self._error
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        self._taken = self.total
        events = self._events
        self._events = []
        return events


async def any_ready(streams: Sequence[RequestStream]) -> None:
    """Wait until one of `streams` is `ready` (one future, woken by whichever moves first:
    the requests of one HTTP request of several prompts)."""
    if any(stream.ready for stream in streams):
        return
    waiter = asyncio.get_running_loop().create_future()
    for stream in streams:
        stream._waiter = waiter
    try:
        await waiter
    finally:
        for stream in streams:
            if stream._waiter is waiter:
                stream._waiter = None


class _Sequence:
    """The route of sequence `index` > 0 of a request with n > 1 (its tag is the
    request's tag + index): what the dispatcher hands it goes to the request's stream."""

    __slots__ = ("stream", "index", "replica")
    writer = None  # (its request's stream is written by its handler: n > 1)

    def __init__(self, stream: RequestStream, index: int) -> None:
        self.stream = stream
        self.index = index
        self.replica = stream.replica

    def _tokens(self, total: int) -> None:
        self.stream._seq_tokens(self.index, total)

    def _push(self, event: pb.Progress) -> None:
        self.stream._push(event)

    def _final(self, event: pb.Progress) -> None:
        self.stream._final(event)

    def _fail(self, exc: BaseException) -> None:
        self.stream._fail(exc)


RELAY_CHUNK = 16  # streams written per loop callback (a scrape can go in between)


def _relay_all(streams: list[RequestStream], start: int = 0,
               then: Callable[[], None] | None = None) -> None:
    """Writes streams[start:start + RELAY_CHUNK], and leaves the rest to the loop's next
    iteration: a batch of 64 streams was one callback of ~1 ms during which nothing else
    this gateway answers (a /metrics scrape, a refusal) could run. `then` runs once the
    last stream is written."""
    end = start + RELAY_CHUNK
    for stream in streams[start:end]:
        stream._relay()
    if end < len(streams):
        asyncio.get_running_loop().call_soon(_relay_all, streams, end, then)
    elif then is not None:
        then()


class _Session:
    """One live Session (over gRPC or the lane): its routes (tag -> stream), outbox and the
    dispatch of the engine's batches. A transport subclass delivers each ProgressBatch to
    `_on_batch`, sends what `_message` builds, and sets `task` (which ends with it)."""

    transport = ""  # "grpc" or "lane", for logs and tests

    def __init__(self, on_broken: Callable[["_Session"], None],
                 probe: Probe | None = None, backlog: Backlog | None = None) -> None:
        self.routes: dict[int, RequestStream] = {}
        self.backlog = backlog if backlog is not None else Backlog()
        self._hold_sent = 0.0  # the hold last told the engine (0: none)
        self.broken = False
        # queue_key(model, replica) -> the engine's last QueueState for it, while "saturated"
        self.saturated: dict[str, pb.QueueState] = {}
        self._refused: dict[tuple[str, int], int] = {}  # refusals made here, not yet reported
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
        self._loop = asyncio.get_running_loop()
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
        """Queue an action (or _LAG_REPORT, or None: the end) for the transport."""
        raise NotImplementedError

    def _stop(self) -> None:
        """End the transport (the Session is closed)."""
        raise NotImplementedError

    def set_queue_state(self, state: pb.QueueState) -> None:
        key = queue_key(state.model, state.replica)
        if state.saturated and state.HasField("until_monotonic_s"):
            self.saturated[key] = state
        else:  # (full without a span: this gateway cannot know until when; ask the engine)
            self.saturated.pop(key, None)

    def note_refused(self, key: tuple[str, int]) -> None:
        """Count a refusal made on the engine's word; reported in one action per model
        and replica."""
        refused = self._refused
        if not refused:
            self._loop.call_later(REFUSED_REPORT_S, self._report_refused)
        refused[key] = refused.get(key, 0) + 1

    def _report_refused(self) -> None:
        refused, self._refused = self._refused, {}
        if self.broken:
            return
        for (model, replica), count in refused.items():
            action = pb.SessionAction()
            action.refused.model = model
            action.refused.count = count
            if replica:
                action.refused.replica = replica
            self.send(action)

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
                self._post(_LAG_REPORT)

    def hold_moved(self, first: bool) -> None:
        """The backlog's oldest stamp moved (`first`: it was empty): tell the engine with
        the next message."""
        self._post(_HOLD_REPORT)

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
        for state in batch.queue_states:  # before any event: a client that
            self.set_queue_state(state)  # hears of a finish sees the queue after it
        routes = self.routes
        finals = []
        for event in batch.events:
            kind = event.WhichOneof("event")
            if kind == "admitted":
                stream = routes.get(event.tag)
                if stream is not None:  # else cancelled or unknown: ignore
                    stream._push(event)
            elif kind == "tokens":
                stream = routes.get(event.tag)
                if stream is not None:
                    stream._tokens(event.tokens.total_tokens)
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
                        stream._relay()
                    else:
                        relayed.append(stream)
                else:
                    stream._tokens(total)
        if relayed:
            self._relaying += 1
            self._loop.call_soon(_relay_all, relayed, 0, self._relayed)
        seq = batch.metrics_seq  # set when the batch finishes requests
        if seq and self.on_metrics is not None and batch.HasField("metrics"):
            self.on_metrics(batch.metrics)  # (lane) the copies, before anyone hears of it
        for event in finals:  # finished or rejected: the last event of its tag
            stream = routes.pop(event.tag, None)
            if stream is not None:
                if seq:  # before the client can hear of it (and scrape)
                    self.finished_seq[stream.replica] = seq
                stream._final(event)
                if event.HasField("rejected"):  # (on a request's own tag only)
                    for tag in range(stream.tag + 1, stream.tag + stream.n):
                        routes.pop(tag, None)  # its other sequences' tags

    def close(self, reason: str, shutdown: bool = False) -> None:
        """Fail every request in flight and stop; idempotent."""
        if self.broken:
            return
        self.broken = True
        self.saturated.clear()
        routes, self.routes = self.routes, {}
        err = engine_unavailable(reason)
        for stream in routes.values():
            stream._fail(err)
        self._stop()
        level = logging.INFO if shutdown else logging.WARNING
        log.log(level, "engine session closed (%d requests in flight failed): %s",
                len(routes), reason)
        self._on_broken(self)


class _GrpcSession(_Session):
    """The Session as the gRPC stream `Session`: the outbox feeds its request iterator,
    a dispatcher task reads its batches."""

    transport = "grpc"

    def __init__(self, stub: pb_grpc.EngineStub, on_broken: Callable[["_Session"], None],
                 probe: Probe | None = None, backlog: Backlog | None = None) -> None:
        super().__init__(on_broken, probe, backlog)
        self._outbox: asyncio.Queue[pb.SessionAction | None] = asyncio.Queue()
        clock = clock_id()  # an engine on this machine books arrivals at our stamps
        self.call = stub.Session(self._actions(), wait_for_ready=False,
                                 metadata=((CLOCK_METADATA, clock),) if clock else None)
        self.task = self._loop.create_task(self._dispatch(), name="engine-session")

    def _post(self, item: pb.SessionAction | None) -> None:
        self._outbox.put_nowait(item)

    def _stop(self) -> None:
        self._outbox.put_nowait(None)
        self.call.cancel()

    async def _actions(self):  # the request iterator grpc.aio consumes
        """Every action queued by the time gRPC is ready for the next message goes in it:
        a burst of requests costs one message, not one each; a due lateness report rides
        along (or goes alone)."""
        outbox = self._outbox
        while True:
            action = await outbox.get()
            if action is None:
                return
            actions = [] if action is _LAG_REPORT or action is _HOLD_REPORT else [action]
            end = False
            while not outbox.empty():
                action = outbox.get_nowait()
                if action is None:
                    end = True
                    break
                if action is not _LAG_REPORT and action is not _HOLD_REPORT:
                    actions.append(action)
            message = self._message(actions)
            if message is not None:
                yield message
            if end:
                return

    async def _dispatch(self) -> None:
        reason = "the engine closed the session"
        try:
            async for batch in self.call:
                self._on_batch(batch)
        except grpc.aio.AioRpcError as exc:
            reason = f"session lost ({exc.code().name}: {exc.details()})"
        except asyncio.CancelledError:
            reason = "the gateway is shutting down"
            raise
        except Exception as exc:  # a bug must not leave requests hanging
            log.exception("engine session dispatcher failed")
            reason = f"session dispatcher failed: {exc!r}"
        finally:
            self.close(reason)


class _LaneSession(_Session):
    """The Session over the engine's same-host lane (gateway.session_lane): each batch is
    dispatched from the socket's data_received, with no task or queue in between; the
    actions queued in one turn of the loop leave as one frame. `task` only waits for the
    end (cancelling it closes the Session, as the gRPC dispatcher's)."""

    transport = "lane"

    def __init__(self, link: LaneLink, on_broken: Callable[["_Session"], None],
                 probe: Probe | None = None, backlog: Backlog | None = None) -> None:
        super().__init__(on_broken, probe, backlog)
        self._link = link
        self._pending: list[pb.SessionAction] = []
        self._flush_due = False
        self._ended: asyncio.Future[None] = self._loop.create_future()
        self.task = self._loop.create_task(self._wait(), name="engine-session-lane")
        link.start(self._on_frame, self.close)

    def hold_moved(self, first: bool) -> None:
        if first:  # a first request read: the engine must not decide past it meanwhile
            self._flush()  # (with what is queued: the hold counts it as sent)
        else:
            self._post(_HOLD_REPORT)

    def _post(self, item: pb.SessionAction | None) -> None:
        if item is not _LAG_REPORT and item is not _HOLD_REPORT and item is not None:
            self._pending.append(item)
        if not self._flush_due and not self.broken:
            self._flush_due = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        actions, self._pending = self._pending, []
        if self.broken:
            return
        message = self._message(actions)
        if message is not None:
            self._link.write(message.SerializeToString())

    def _on_frame(self, payload: bytes) -> None:
        if self.broken:
            return
        try:
            self._on_batch(pb.ProgressBatch.FromString(payload))
        except Exception as exc:  # a bug or a bad frame must not leave requests hanging
            log.exception("engine session dispatcher failed")
            self.close(f"session dispatcher failed: {exc!r}")
            return
        # Acknowledged once this batch's writes are done (the relay's last chunk, else
        # the callbacks it woke, which run first): the engine's window then paces it by
        # what the gateway can write, as gRPC's did.
        if not self._relaying and self._link.ack_due():
            self._loop.call_soon(self._link.acknowledge_read)

    def _relayed(self) -> None:
        super()._relayed()
        if not self._relaying and self._link.ack_due():
            self._link.acknowledge_read()

    def _stop(self) -> None:
        self._link.close()
        if not self._ended.done():
            self._ended.set_result(None)

    async def _wait(self) -> None:
        try:
            await self._ended
        finally:
            self.close("the gateway is shutting down")  # (cancelled; else already closed)


class EngineClient:
    """Lazily connected client of one engine. Create and use inside a running loop."""

    def __init__(
        self, target: str, *, connect_timeout: float = 1.0, rpc_timeout: float = 5.0,
        control_token: str | None = None, probe: Probe | None = None,
        session_lane: str | None = None,
    ) -> None:
        self.target = target
        # "auto": the Session over the engine's same-host lane when it offers one, else
        # gRPC; "off": gRPC always. None: $INFERENCE_LAB_SESSION_LANE, else "auto".
        self.session_lane = session_lane or os.environ.get(SESSION_LANE_ENV) or "auto"
        if self.session_lane not in SESSION_LANE_MODES:
            raise ValueError(f"session_lane must be one of {', '.join(SESSION_LANE_MODES)}, "
                             f"got {self.session_lane!r}")
        self._lane_refusal: str | None = None  # why the last Session went over gRPC
        self._probe = probe  # an observer of the Session pipe (diagnostics), usually None
        # Sent with SetCapacity, which an engine started with a control token requires.
        self._control_metadata = (
            (("authorization", f"Bearer {control_token}"),) if control_token else None
        )
        self._connect_timeout = connect_timeout
        self._rpc_timeout = rpc_timeout
        self._tags = itertools.count(1)
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.EngineStub | None = None
        self._stale = False
        self._scrape_channel: grpc.aio.Channel | None = None  # GetMetrics, WatchMetrics
        self._feed = MetricsFeed(self._watch_metrics, connect_timeout)
        self._session: _Session | None = None
        self._connecting: asyncio.Future[None] | None = None
        self._refreshing: asyncio.Future[None] | None = None
        self._models: dict[str, pb.ModelInfo] = {}
        self._models_at = float("-inf")
        self._closed = False
        self._background: set[asyncio.Task[None]] = set()  # old channels being closed
        # Generation requests read and not yet sent (gateway.backlog): the Session's hold.
        self.backlog = Backlog()
        self.backlog.on_change = self._hold_moved

    def _hold_moved(self, first: bool) -> None:
        session = self._session
        if session is not None and not session.broken:
            session.hold_moved(first)

    # ---- the hot path ------------------------------------------------------------------

    async def open(
        self, model: str, prompt: Sequence[int] | int, max_tokens: int | None, *, priority: int = 0,
        request_id: str = "", n: int = 1, replica: int | None = None,
        arrived: float | None = None, held: object = None,
    ) -> RequestStream:
        """Start one request on the Session (on replica `replica` of the model; None =
        the engine's default, replica 0); its first event is `admitted` or `rejected`.
        `max_tokens` None lets the engine choose the length. With n > 1 it samples n
        sequences: their progress lands in `totals` and each sends its Finished. Raises
        GatewayError(queue_saturated) at once while the engine's last word is that the
        replica's queue is full, GatewayError(engine_unavailable) when the engine cannot be
        reached. `prompt` is the prompt's token IDs (or only its length). `arrived`: when
        the request arrived here (time.monotonic()); an engine on this machine books its
        arrival then (inference_lab.common.clock). `held`: its connection's mark in the
        backlog, cleared once the request is sent (or refused here)."""
        prompt_tokens = prompt if isinstance(prompt, int) else len(prompt)
        for _ in range(2):
            session = self._session
            if session is None or session.broken:
                await self._ensure_session()
                continue
            refused = self.refusal(model, prompt_tokens, max_tokens, n, replica, arrived)
            if refused is not None:
                if held is not None:
                    self.backlog.clear(held)
                raise GatewayError(ErrorKind.QUEUE_SATURATED, refused)
            tag = next(self._tags)
            if self._probe is not None:
                self._probe.on_open(tag)
            stream = RequestStream(tag, asyncio.get_running_loop(), model, n, replica or 0)
            action = pb.SessionAction()
            action.open.tag = tag
            req = action.open.request
            req.model = model
            req.prompt_tokens = prompt_tokens
            if not isinstance(prompt, int):
                req.prompt_token_ids = ids_to_bytes(prompt)
            if max_tokens is not None:
                req.max_tokens = max_tokens
            req.priority = priority
            if request_id:
                req.request_id = request_id
            if replica is not None:
                req.replica = replica
            if arrived is not None:
                req.arrival_monotonic_s = arrived
            session.routes[tag] = stream  # no await between the liveness check and this
            if n > 1:
                req.n = n
                for index in range(1, n):  # sequence i reports under tag + i
                    session.routes[next(self._tags)] = _Sequence(stream, index)
            session.send(action)
            if held is not None:
                self.backlog.clear(held)  # (before the message is built: it is sent)
            return stream
        raise engine_unavailable("the session broke while connecting")

    def refusal(self, model: str, prompt_tokens: int, max_tokens: int | None, n: int = 1,
                replica: int | None = None, arrived: float | None = None) -> str | None:
        """The engine's saturation message when `open` would refuse this request, which
        arrived at `arrived` (time.monotonic(); None: now), at once: its stamp lies in the
        span over which the engine's last word says the queue is full (the refusal is then
        counted for the engine's `Refused` report); else None: the check `open` makes, for
        a caller that answers the 529 without raising."""
        session = self._session
        if session is None or session.broken:
            return None
        full = session.saturated.get(queue_key(model, replica or 0))
        if full is None:
            return None
        stamp = time.monotonic() if arrived is None else arrived
        if not full.since_monotonic_s <= stamp < full.until_monotonic_s:
            return None  # (outside the span: the engine judges it at its instant)
        if not self._fits(model, prompt_tokens, max_tokens or 1, n):
            # (one that can never fit goes on: the engine answers it with its 400 first;
            # without max_tokens the engine fits the length it chooses to the model)
            return None
        session.note_refused((model, replica or 0))
        return full.message

    def may_refuse(self, arrived: float | None) -> bool:
        """Whether some queue's "full" span covers an arrival at `arrived` (None: now): a
        cheap test before parsing a body only to ask `refusal`."""
        session = self._session
        if session is None or session.broken or not session.saturated:
            return False
        stamp = time.monotonic() if arrived is None else arrived
        return any(full.since_monotonic_s <= stamp < full.until_monotonic_s
                   for full in session.saturated.values())

    def _fits(self, model: str, prompt_tokens: int, max_tokens: int, n: int = 1) -> bool:
        """Within the largest request the engine says the model takes (its checks come
        before its queue's); n sequences share the prompt's full KV blocks and hold the
        rest each."""
        info = self._models.get(model)
        if info is None:
            return False
        tokens = prompt_tokens + max_tokens
        if n == 1:
            return tokens <= info.max_request_tokens
        block = max(info.block_size, 1)
        one = -(-tokens // block)
        return tokens <= info.max_request_tokens and (
            one + (n - 1) * (one - prompt_tokens // block) <= info.kv_blocks)

    def cancel(self, stream: RequestStream, reason: BaseException | None = None) -> None:
        """Cancel a request still running in the engine (no-op when it is done)."""
        if stream.done:
            return
        session = self._session
        if session is not None and not session.broken:
            for tag in range(stream.tag + 1, stream.tag + stream.n):
                session.routes.pop(tag, None)
            if session.routes.pop(stream.tag, None) is not None:
                action = pb.SessionAction()
                action.cancel.tag = stream.tag
                session.send(action)
                # (a place it frees counts from the engine's next step boundary, where the
                # span of a "full" announcement ends anyway: the copy stays right)
        stream._fail(reason or ClientGone())

    @property
    def inflight(self) -> int:
        session = self._session
        return 0 if session is None or session.broken else len(session.routes)

    # ---- connection management -----------------------------------------------------------

    async def _ensure_session(self) -> None:
        if self._closed:
            raise engine_unavailable("the gateway is shutting down")
        session = self._session
        if session is not None and not session.broken:
            return
        await self._single_flight("_connecting", self._connect)

    async def _single_flight(self, attr: str, fn: Callable[[], Awaitable[None]]) -> None:
        """Run fn once for every concurrent caller; a caller's cancellation spares it."""
        fut = getattr(self, attr)
        if fut is None:
            fut = asyncio.ensure_future(fn())
            setattr(self, attr, fut)

            def _clear(f: asyncio.Future[None]) -> None:
                setattr(self, attr, None)
                if not f.cancelled():
                    f.exception()  # retrieved: the callers see it

            fut.add_done_callback(_clear)
        await asyncio.shield(fut)

    def _current_stub(self) -> pb_grpc.EngineStub:
        if self._channel is None or self._stale:
            old = self._channel
            self._channel = grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS)
            self._stub = pb_grpc.EngineStub(self._channel)
            self._stale = False
            if old is not None:
                task = asyncio.get_running_loop().create_task(old.close(grace=None))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
        assert self._stub is not None
        return self._stub

    async def _connect(self) -> None:
        await self._fetch_models()  # the engine answers: it is reachable (and models fresh)
        if self._closed:
            raise engine_unavailable("the gateway is shutting down")
        link = await self._open_lane() if self.session_lane == "auto" else None
        if self._closed:
            if link is not None:
                link.close()
            raise engine_unavailable("the gateway is shutting down")
        if link is not None:
            self._session = _LaneSession(link, self._on_session_broken, self._probe,
                                         self.backlog)
            self._session.on_metrics = self._feed.take
        else:
            self._session = _GrpcSession(self._current_stub(), self._on_session_broken,
                                         self._probe, self.backlog)
        log.info("engine session open to %s (%d models) over %s", self.target,
                 len(self._models), "the session lane" if link is not None else "gRPC")

    async def _open_lane(self) -> LaneLink | None:
        """The engine's Session lane when it has one on this host and it answers; else
        None, with the reason logged once (until it changes)."""
        mine = clock_id()
        try:
            info = await self._current_stub().SessionLane(
                pb.SessionLaneRequest(), timeout=self._connect_timeout, wait_for_ready=False)
        except grpc.aio.AioRpcError as exc:
            reason = (f"the engine has no session lane ({exc.code().name})"
                      if exc.code() is grpc.StatusCode.UNIMPLEMENTED
                      else f"SessionLane failed ({exc.code().name})")
            return self._no_lane(reason)
        if not mine or info.clock_id != mine:
            return self._no_lane("the engine runs on another host (its clock differs)")
        try:
            link = await connect_lane(info, mine)
        except LaneUnavailable as exc:
            return self._no_lane(str(exc))
        self._lane_refusal = None
        return link

    def _no_lane(self, reason: str) -> None:
        if reason != self._lane_refusal:
            self._lane_refusal = reason
            log.info("engine session over gRPC: %s", reason)
        return None

    def _on_session_broken(self, session: _Session) -> None:
        if session is self._session:
            self._stale = True  # the next request builds a fresh channel

    async def _unary(self, name: str, request: Any, timeout: float, metadata=None) -> Any:
        stub = self._current_stub()
        try:
            return await getattr(stub, name)(request, timeout=timeout, wait_for_ready=False,
                                             metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            err = from_grpc_error(exc)
            if err.kind is ErrorKind.ENGINE_UNAVAILABLE:
                session = self._session
                if session is None or session.broken:
                    self._stale = True
            raise err from None

    def connect_soon(self) -> None:
        """Open the Session now, in the background (a gateway starting: its first requests
        need not wait for it, which would make their first tokens late); a failure is left
        to the first request, which connects again."""
        if self._session is None and self._connecting is None and not self._closed:
            task = asyncio.get_running_loop().create_task(self._connect_quietly())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _connect_quietly(self) -> None:
        try:
            await self._ensure_session()
        except Exception as exc:  # (GatewayError and the like: the first request says it)
            log.debug("engine session not opened at start: %s", exc)

    async def close(self) -> None:
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            session.close("the gateway is shutting down", shutdown=True)
            session.task.cancel()
            await asyncio.gather(session.task, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close(grace=None)
            self._channel = None
        await self._feed.close()
        if self._scrape_channel is not None:
            await self._scrape_channel.close(grace=None)
            self._scrape_channel = None
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    # ---- models ------------------------------------------------------------------------

    async def _fetch_models(self) -> None:
        resp = await self._unary("ListModels", pb.ListModelsRequest(), self._connect_timeout)
        self._models = {m.name: m for m in resp.models}
        self._models_at = time.monotonic()

    async def list_models(self, refresh: bool = False) -> list[pb.ModelInfo]:
        """The served models (cached; `refresh` asks the engine, so it doubles as a ping)."""
        if refresh or not self._models:
            await self._fetch_models()
        return list(self._models.values())

    async def resolve_model(self, name: str) -> pb.ModelInfo:
        """The served model called `name`; refreshes the cache once if it is unknown."""
        info = self._models.get(name)
        if info is not None:
            return info
        session = self._session
        if session is None or session.broken:
            await self._ensure_session()  # connecting refreshes the cache
        elif time.monotonic() - self._models_at >= _MODEL_REFRESH_MIN_INTERVAL_S:
            await self._single_flight("_refreshing", self._fetch_models)
        info = self._models.get(name)
        if info is None:
            shown = name if len(name) <= _NAME_SHOWN else name[:_NAME_SHOWN] + "..."
            raise GatewayError(ErrorKind.MODEL_NOT_FOUND, f"The model `{shown}` does not exist.")
        return info

    # ---- capacity -----------------------------------------------------------------------

    async def get_capacity(self, model: str | None = None,
                           replica: int | None = None) -> list[pb.ModelCapacity]:
        """Every replica's row (of one model and/or one replica index when given)."""
        resp = await self._unary(
            "GetCapacity", pb.GetCapacityRequest(model=model or "", replica=replica),
            self._rpc_timeout)
        return list(resp.models)

    async def load_lora_adapter(self, name: str, path: str, base: str = "") -> str:
        """Register a LoRA adapter in the engine; the model list is refreshed."""
        resp = await self._unary("LoadLoraAdapter", pb.LoadLoraAdapterRequest(
            lora_name=name, lora_path=path, base_model_name=base), self._rpc_timeout,
            metadata=self._control_metadata)
        await self._fetch_models()
        return resp.message

    async def unload_lora_adapter(self, name: str) -> str:
        resp = await self._unary("UnloadLoraAdapter", pb.UnloadLoraAdapterRequest(lora_name=name),
                                 self._rpc_timeout, metadata=self._control_metadata)
        await self._fetch_models()
        return resp.message

    async def set_capacity(
        self, model: str | None = None, max_num_seqs: int | None = None,
        max_waiting: int | None = None, replica: int | None = None,
    ) -> list[pb.ModelCapacity]:
        fields: dict[str, Any] = {}
        if model:
            fields["model"] = model
        if replica is not None:
            fields["replica"] = replica
        if max_num_seqs is not None:
            fields["max_num_seqs"] = max_num_seqs
        if max_waiting is not None:
            fields["max_waiting"] = max_waiting
        resp = await self._unary(
            "SetCapacity", pb.SetCapacityRequest(**fields), self._rpc_timeout,
            metadata=self._control_metadata,
        )
        session = self._session
        if session is not None and not session.broken:
            # A raised bound counts from now, not the next push. A reply's "full" is never
            # taken: it is the queue at the change, before the engine's next step, and the
            # Session may already have announced a later state (that step moving the
            # waiting requests into the new places); a stale "full" applied after it would
            # refuse every request here for good, the engine having nothing new to announce.
            # "Full" comes on the Session, in order; until then the engine refuses itself.
            for state in resp.queue_states:
                if not state.saturated:
                    session.set_queue_state(state)
        return list(resp.models)

    # ---- replicas -----------------------------------------------------------------------

    async def set_replicas(self, model: str | None, replicas: int) -> list[pb.ModelCapacity]:
        """Add or drain replicas live (SetReplicas, with the control token)."""
        resp = await self._unary(
            "SetReplicas", pb.SetReplicasRequest(model=model or "", replicas=replicas),
            self._rpc_timeout, metadata=self._control_metadata)
        return list(resp.models)

    # ---- metrics ------------------------------------------------------------------------

    async def replica_metrics(self, replica: int) -> bytes:
        """Replica `replica`'s exposition (GetMetrics with engines = [replica]) from the
        copy the engine keeps pushed here (gateway.metrics_feed): no engine call per
        scrape. It shows every request of this gateway that finished on the replica
        before the call; otherwise it is at most ~50 ms old. Asks GetMetrics when the
        copy cannot answer (an engine without WatchMetrics, a feed that does not come)."""
        text = await self._feed.text(replica, self._finished_seq(replica))
        if text is None:
            return await self.metrics_text(engines=[replica])
        return text

    def replica_metrics_now(self, replica: int) -> bytes | None:
        """`replica_metrics` when its copy is here already (no wait, no call); else None."""
        return self._feed.ready(replica, self._finished_seq(replica))

    def _finished_seq(self, replica: int) -> int:
        session = self._session
        return 0 if session is None or session.broken else session.finished_seq.get(replica, 0)

    def copy_waits(self, replica: int) -> int:
        """Scrapes of `replica` whose copy had to wait for a newer push (a request this
        gateway saw finish was not in it yet)."""
        return self._feed.waits.get(replica, 0)

    def _scrape_stub(self) -> pb_grpc.EngineStub:
        if self._scrape_channel is None:
            self._scrape_channel = grpc.aio.insecure_channel(self.target,
                                                             options=SCRAPE_CHANNEL_OPTIONS)
        return pb_grpc.EngineStub(self._scrape_channel)

    def _watch_metrics(self):
        return self._scrape_stub().WatchMetrics(pb.WatchMetricsRequest(), wait_for_ready=False)

    async def metrics_text(self, models: list[str] | None = None,
                           engines: list[int] | None = None) -> bytes:
        """The engine's Prometheus exposition (vllm:* and inference_lab_*) of `models` on
        the engines (replicas) `engines` (None: all), as text; one unary call with a short
        deadline. Empty when no model has those replicas."""
        request = pb.GetMetricsRequest(models=models or (), engines=engines or ())
        stub = self._scrape_stub()
        try:
            resp = await stub.GetMetrics(request, timeout=self._connect_timeout,
                                         wait_for_ready=False)
        except grpc.aio.AioRpcError as exc:
            err = from_grpc_error(exc)
            if err.kind is ErrorKind.MODEL_NOT_FOUND:  # NOT_FOUND: no such replica (any more)
                return b""
            if err.kind is ErrorKind.ENGINE_UNAVAILABLE:  # the next scrape connects afresh
                channel, self._scrape_channel = self._scrape_channel, None
                self._feed.stop()
                if channel is not None:
                    await channel.close(grace=None)
            raise err from None
        return resp.text

    # ---- replica-level faults ----------------------------------------------------------

    async def inject_fault(self, kind: int, seconds: float = 0.0, factor: float = 0.0,
                           replica: int | None = None) -> pb.EngineFaultState:
        """InjectFault (with the control token): crash, stall, slow down or clear, of the
        whole engine or of one replica (REPLICA_NOT_FOUND when no model has it)."""
        return await self._unary(
            "InjectFault", pb.InjectFaultRequest(kind=kind, seconds=seconds, factor=factor,
                                                 replica=replica),
            self._rpc_timeout, metadata=self._control_metadata)

    async def fault_state(self, replica: int | None = None) -> pb.EngineFaultState:
        """The whole engine's faults, or one replica's in effect."""
        return await self._unary("GetFaultState", pb.GetFaultStateRequest(replica=replica),
                                 self._rpc_timeout)

    async def stalled_for(self, replica: int) -> float:
        """Seconds left of a stall fault on `replica` (0 from an engine without faults)."""
        stub = self._current_stub()
        try:
            state = await stub.GetFaultState(pb.GetFaultStateRequest(replica=replica),
                                             timeout=self._connect_timeout,
                                             wait_for_ready=False)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                return 0.0
            raise from_grpc_error(exc) from None
        return state.stalled_for_s

    # ---- health -------------------------------------------------------------------------

    async def serving(self) -> bool:
        """The engine's gRPC health: False while it drains for shutdown (an engine without
        the health service counts as serving)."""
        self._current_stub()
        health = health_pb2_grpc.HealthStub(self._channel)
        try:
            reply = await health.Check(
                health_pb2.HealthCheckRequest(service=_ENGINE_SERVICE),
                timeout=self._connect_timeout, wait_for_ready=False,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                return True
            raise from_grpc_error(exc) from None
        return reply.status == health_pb2.HealthCheckResponse.SERVING
