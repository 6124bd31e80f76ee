"""The engine's Session lane: the same Session as the gRPC stream, over a plain socket.

A gateway on this host (the same `clock_id`) asks `SessionLane` for the lane's address and
token, connects, and runs its Session here instead of over gRPC: one frame per
SessionActions in, one per ProgressBatch out (inference_lab.lane.frames). grpc.aio spends
most of a pacer wake-up's CPU writing one batch (and the gateway as much reading it); a
frame written to a socket costs a small fraction of that (BENCHMARKS.md).

Every line of Session logic is the service's own (`SessionSink.serve`,
`EngineService.session_actions`): this module only turns frames into messages and back. It
listens on 127.0.0.1 only (a Kubernetes pod's containers share it); the per-process token,
handed out by the gRPC API, keeps the lane exactly as reachable as the Session itself.

A connection's first frame must be a LaneHello with the token (compared in constant time),
at most HELLO_MAX_FRAME bytes and within HELLO_TIMEOUT_S, else it is closed: only a
connection that said the token may send frames of up to MAX_FRAME, so one without it costs
the engine a few KB at most. At most MAX_CONNECTIONS are open at once (the lane serves the
gateways of this host; a connection beyond them is closed at once, and a gateway refused
keeps its gRPC Session). A frame that does not parse, or one above the size limit, closes that
connection (logged once per engine): its requests are cancelled as for a lost Session, and
the engine serves everyone else on.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets

from google.protobuf.message import DecodeError

from inference_lab.common.clock import clock_id
from inference_lab.engine.service.rpc import EngineService
from inference_lab.engine.service.session import SessionSink
from inference_lab.lane.frames import MAX_FRAME, WINDOW, FrameProtocol
from inference_lab.v1 import engine_pb2 as pb

log = logging.getLogger(__name__)

LANE_HOST = "127.0.0.1"
TOKEN_BYTES = 32
HELLO_TIMEOUT_S = 5.0  # a connection that sends no hello by then is closed
# A LaneHello is a 32-byte token and a clock id: a first frame longer than this is no hello.
HELLO_MAX_FRAME = 4096
MAX_CONNECTIONS = 32
MODES = ("auto", "off")  # --session-lane: auto = listen; off = gRPC Session only


class MalformedFrame(ValueError):
    """A lane frame that is not the message it must be."""


class _Once:
    """Logs a kind of client error once per engine (a misbehaving client must not flood
    the log), then at DEBUG."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def warn(self, kind: str, message: str, *args) -> None:
        level = logging.DEBUG if kind in self.seen else logging.WARNING
        self.seen.add(kind)
        log.log(level, message, *args)


class LaneConnection(FrameProtocol):
    """One lane client: a hello, then its Session (SessionSink.serve) with this
    connection's frames as the transport."""

    window = WINDOW  # a gateway that reads late makes the writer wait (and tokens merge)

    def __init__(self, lane: "SessionLane") -> None:
        super().__init__()
        self.lane = lane
        self.sink: SessionSink | None = None
        self.writer: asyncio.Task[None] | None = None
        self.on_frame = self._hello
        self.max_frame = HELLO_MAX_FRAME  # until the hello has said the token
        self._hello_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.lane.connections) >= MAX_CONNECTIONS:
            self.lane.once.warn("connections", "session lane: a connection beyond %d closed",
                                MAX_CONNECTIONS)
            self.fail(ConnectionRefusedError("too many lane connections"))
            return
        self.lane.connections.add(self)
        self._hello_timer = asyncio.get_running_loop().call_later(
            HELLO_TIMEOUT_S, self.fail, MalformedFrame("no hello"))

    def _hello(self, payload: bytes) -> None:
        self._hello_timer.cancel()
        lane = self.lane
        try:
            hello = pb.LaneHello.FromString(payload)
        except DecodeError:
            self.fail(MalformedFrame("a first frame that is not a LaneHello"))
            return
        if not hmac.compare_digest(hello.token, lane.token):
            lane.once.warn("token", "session lane: a connection with a wrong token closed")
            self.close()
            return
        self.max_frame = MAX_FRAME
        self.write(pb.LaneHello(clock_id=lane.clock).SerializeToString())
        sink = self.sink = SessionSink(lane.service)
        sink.lane = True  # a batch finishing requests carries their replicas' metrics
        sink.same_clock = bool(lane.clock) and hello.clock_id == lane.clock
        self.on_frame = self._actions
        self.writer = asyncio.get_running_loop().create_task(self._serve(sink),
                                                             name="session-lane")

    def _actions(self, payload: bytes) -> None:
        try:
            message = pb.SessionActions.FromString(payload)
        except DecodeError as exc:
            self.fail(MalformedFrame(f"a frame that is not a SessionActions: {exc}"))
            return
        if message.HasField("lane_read_bytes"):
            self.acknowledge(message.lane_read_bytes)
            if not message.actions and not message.HasField("relay_lag_s"):
                return  # an acknowledgement alone
        try:
            self.lane.service.session_actions(message, self.sink)
        except Exception as exc:  # a malformed action: that Session ends, as over gRPC
            self.fail(exc)

    async def _write(self, batch: pb.ProgressBatch) -> None:
        self.write(batch.SerializeToString())
        if batch.HasField("metrics"):  # whole expositions: not the tokens' window
            self.credit(batch.metrics.ByteSize())
        if self.pushing_back():  # the gateway reads late (a window behind): wait, as a
            await self.drain()  # gRPC write waits for its window

    async def _serve(self, sink: SessionSink) -> None:
        try:
            await sink.serve(self._write)
        except ConnectionError:
            pass  # the client went: its requests were cancelled on the way out
        except Exception as exc:
            self.lane.once.warn("session", "session lane: a Session ended with %r", exc)
        finally:
            self.close()  # (after a closing: the batches written go first, then EOF)

    def lost(self, exc: Exception | None) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        self.lane.connections.discard(self)
        if exc is not None and not isinstance(exc, ConnectionError):
            self.lane.once.warn("frame", "session lane: connection closed: %s", exc)
        if self.sink is not None:
            self.sink.end_input(exc)  # a malformed frame fails the Session, like gRPC's
            writer = self.writer
            if writer is not None and not writer.done() and not self.sink.closing:
                writer.cancel()  # the client is gone: cancel its requests now


class SessionLane:
    """The lane's listener: address, token, and the connections it serves."""

    def __init__(self, service: EngineService) -> None:
        self.service = service
        self.token = secrets.token_bytes(TOKEN_BYTES)
        self.clock = clock_id() or ""
        self.once = _Once()
        self.connections: set[LaneConnection] = set()
        self.server: asyncio.AbstractServer | None = None
        self.host = LANE_HOST
        self.port = 0

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: LaneConnection(self), LANE_HOST, 0)
        self.port = self.server.sockets[0].getsockname()[1]
        log.info("session lane on %s:%d (same-host gateways skip gRPC for the Session)",
                 self.host, self.port)

    def info(self) -> pb.SessionLaneInfo:
        return pb.SessionLaneInfo(host=self.host, port=self.port, token=self.token,
                                  clock_id=self.clock, max_frame_bytes=MAX_FRAME,
                                  window_bytes=WINDOW)

    async def stop(self) -> None:
        """No new connections; the open ones close (the engine closed their Sessions
        first: close_sessions)."""
        if self.server is not None:
            self.server.close()
            for connection in list(self.connections):
                connection.close()
            await self.server.wait_closed()
            self.server = None
