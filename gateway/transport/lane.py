"""The Session over the engine's same-host lane: connect, say hello, then frames.

When the engine runs on this host (its `SessionLane` answer names our own clock_id), the
gateway carries its Session over the lane's plain socket instead of the gRPC stream: the
same SessionActions and ProgressBatch messages, one frame each
(inference_lab.lane.frames), parsed in `data_received` and handed to the Session's
dispatch synchronously: no grpc.aio poller thread, no task per batch.

`connect_lane` opens the connection, sends the hello (the engine's token and our clock)
and waits for the engine's hello, all within a short timeout; any failure (refused: the
engine is in another network namespace; a wrong token: closed; silence) raises
LaneUnavailable and the gateway keeps the gRPC Session. `LaneSession` is the Session over
a link that passed the hello: the actions queued in one turn of the loop leave as one
frame, and what it has read is acknowledged for the engine's flow-control window.

Knows: the lane's framing, hello and acknowledgements. Does not know what the actions
mean (gateway.transport.session), gRPC, HTTP.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from google.protobuf.message import DecodeError

from inference_lab.gateway.backlog import Backlog
from inference_lab.gateway.transport.session import HOLD_DUE, LAG_DUE, Probe, Session
from inference_lab.lane.frames import FrameProtocol
from inference_lab.v1 import engine_pb2 as pb

log = logging.getLogger("inference_lab.gateway.engine_client")  # the engine client's one logger

CONNECT_TIMEOUT_S = 0.5  # connect + hello + the engine's answer, or the gRPC Session


class LaneUnavailable(Exception):
    """The lane cannot be used; the reason is the message."""


class LaneLink(FrameProtocol):
    """The lane connection: first the engine's hello, then every frame to `start`'s
    `deliver`;
    `on_lost(reason)` once when it ends after the hello (not when this side closed it)."""

    def __init__(self) -> None:
        super().__init__()
        self.answer: asyncio.Future[pb.LaneHello] = asyncio.get_running_loop().create_future()
        self.on_frame = self._hello
        self._held: list[bytes] = []  # frames after the hello, until `start`
        self.on_lost: Callable[[str], None] | None = None
        self.closed_here = False
        self.ack_every = 0  # acknowledge each this many bytes read (half the window; 0: never)
        self._told = 0  # bytes read as last acknowledged

    def _hello(self, payload: bytes) -> None:
        try:
            hello = pb.LaneHello.FromString(payload)
        except DecodeError:
            self.fail(LaneUnavailable("the lane's first frame is not a LaneHello"))
            return
        self.on_frame = self._held.append
        if not self.answer.done():
            self.answer.set_result(hello)

    def start(self, deliver: Callable[[bytes], None], on_lost: Callable[[str], None]) -> None:
        """Frames from now on go to `deliver` (some may already have come with the hello:
        they are held until now)."""
        self.on_lost = on_lost
        held, self._held = self._held, []
        self.on_frame = deliver
        for payload in held:
            deliver(payload)

    def ack_due(self) -> bool:
        """Half a window read since the last acknowledgement (the engine's flow control,
        engine.service.lane)."""
        every = self.ack_every
        return bool(every) and self.received - self._told >= every

    def acknowledge_read(self) -> None:
        """Tell the engine every byte read so far."""
        if self.received > self._told:
            self._told = self.received
            self.write(pb.SessionActions(lane_read_bytes=self.received).SerializeToString())

    def lost(self, exc: Exception | None) -> None:
        if not self.answer.done():
            self.answer.set_exception(LaneUnavailable(
                f"the engine closed the lane ({exc or 'wrong token?'})"))
            return
        if self.on_lost is not None and not self.closed_here:
            self.on_lost("the engine closed the session" if exc is None
                         else f"session lost ({exc})")

    def close(self) -> None:
        self.closed_here = True
        super().close()


async def connect_lane(info: pb.SessionLaneInfo, clock: str) -> LaneLink:
    """A lane connection that passed the hello, or LaneUnavailable."""
    loop = asyncio.get_running_loop()
    link: LaneLink | None = None
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            _, link = await loop.create_connection(LaneLink, info.host, info.port)
            link.max_frame = info.max_frame_bytes or link.max_frame
            link.ack_every = info.window_bytes // 2
            link.write(pb.LaneHello(token=info.token, clock_id=clock).SerializeToString())
            await link.answer
    except (OSError, TimeoutError) as exc:
        if link is not None:
            link.close()
        raise LaneUnavailable(f"cannot connect to {info.host}:{info.port} "
                              f"({exc or type(exc).__name__})") from None
    except LaneUnavailable:
        link.close()
        raise
    return link


class LaneSession(Session):
    """The Session over the engine's same-host lane (`connect_lane`): each batch is
    dispatched from the socket's data_received, with no task or queue in between; the
    actions queued in one turn of the loop leave as one frame. `task` only waits for the
    end (cancelling it closes the Session, as the gRPC dispatcher's)."""

    transport = "lane"

    def __init__(self, link: LaneLink, on_broken: Callable[["Session"], None],
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
            self._post(HOLD_DUE)

    def _post(self, item: pb.SessionAction | None) -> None:
        if item is not LAG_DUE and item is not HOLD_DUE and item is not None:
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
