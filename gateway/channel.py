"""The gateway's connection to the engine: one grpc.aio channel and the one Session over it.

Knows: the channel's options, and when it is rebuilt; which transport a Session takes and
when a broken one is replaced. The Session runs over the engine's same-host lane
(gateway.transport.lane) when `SessionLane` answers with this host's clock id and the
lane's hello succeeds, else over gRPC (UNIMPLEMENTED, another clock, a refused or silent
connect); the choice is made at every (re)connect, and its reason logged once.

Failure policy: nothing waits for the engine forever. Calls use wait_for_ready=False and
short deadlines, so a new request learns "engine unavailable" within ~1 s. When the Session
breaks (engine gone, stream closed) every request in flight fails with engine_unavailable
(the engine itself cancels them when the stream drops) and the channel is marked stale; the
next request builds a fresh channel and Session (lazy reconnect, no reconnect backoff to
wait out), so a restarted engine is served again without restarting the gateway.

Does not know: what travels on the Session (gateway.transport), the unary calls' meaning
(gateway.engine_client), HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Awaitable, Callable

import grpc

from inference_lab.common.clock import clock_id
from inference_lab.gateway.backlog import Backlog
from inference_lab.gateway.errors import ErrorKind, engine_unavailable, from_grpc_error
from inference_lab.gateway.transport.grpc_session import GrpcSession
from inference_lab.gateway.transport.lane import LaneLink, LaneSession, LaneUnavailable, connect_lane
from inference_lab.gateway.transport.session import Probe, Session
from inference_lab.v1 import engine_pb2 as pb
from inference_lab.v1 import engine_pb2_grpc as pb_grpc

log = logging.getLogger("inference_lab.gateway.engine_client")  # the engine client's one logger

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
    # ... and small means small: gRPC's default window (64 KB) holds many batches of
    # hundreds of streams before the engine's write waits, so a gateway that cannot keep
    # up reads tokens late while the engine sees no lateness. With 1 KB the engine waits
    # (and merges) once the gateway is a few batches behind, while the batches of a few
    # dozen streams still never wait.
    ("grpc.http2.lookahead_bytes", 1024),
)
SESSION_LANE_ENV = "INFERENCE_LAB_SESSION_LANE"  # the gateway's --session-lane default
SESSION_LANE_MODES = ("auto", "off")


class SingleFlight:
    """One run of an async function for every concurrent caller; a caller's cancellation
    spares it."""

    __slots__ = ("_fut",)

    def __init__(self) -> None:
        self._fut: asyncio.Future[None] | None = None

    @property
    def running(self) -> bool:
        return self._fut is not None

    async def run(self, fn: Callable[[], Awaitable[None]]) -> None:
        fut = self._fut
        if fut is None:
            fut = self._fut = asyncio.ensure_future(fn())

            def _clear(f: asyncio.Future[None]) -> None:
                self._fut = None
                if not f.cancelled():
                    f.exception()  # retrieved: the callers see it

            fut.add_done_callback(_clear)
        await asyncio.shield(fut)


class EngineChannel:
    """The channel to the engine at `target` and its Session, (re)connected lazily.

    `prepare` runs first at every connect (the engine answers: it is reachable), returning
    how many models it serves (for the log line); `on_metrics` takes the metrics copies a
    lane batch carries (gateway.metrics_feed). `backlog` is the Session's hold."""

    def __init__(self, target: str, *, connect_timeout: float, session_lane: str | None,
                 probe: Probe | None, backlog: Backlog,
                 prepare: Callable[[], Awaitable[int]],
                 on_metrics: Callable[[pb.MetricsPush], None],
                 metadata: tuple[tuple[str, str], ...] | None = None) -> None:
        self.target = target
        self._metadata = metadata  # the secret sent with Session and SessionLane, if any
        # "auto": the Session over the engine's same-host lane when it offers one, else
        # gRPC; "off": gRPC always. None: $INFERENCE_LAB_SESSION_LANE, else "auto".
        self.session_lane = session_lane or os.environ.get(SESSION_LANE_ENV) or "auto"
        if self.session_lane not in SESSION_LANE_MODES:
            raise ValueError(f"session_lane must be one of {', '.join(SESSION_LANE_MODES)}, "
                             f"got {self.session_lane!r}")
        self._lane_refusal: str | None = None  # why the last Session went over gRPC
        self._probe = probe  # an observer of the Session pipe (diagnostics), usually None
        self._connect_timeout = connect_timeout
        self._prepare = prepare
        self._on_metrics = on_metrics
        self.channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.EngineStub | None = None
        self._stale = False
        self.session: Session | None = None
        self._connecting = SingleFlight()
        self.closed = False
        self._background: set[asyncio.Task[None]] = set()  # old channels being closed
        # Generation requests read and not yet sent (gateway.backlog): the Session's hold.
        self.backlog = backlog
        backlog.listen(self._hold_moved)

    def live(self) -> Session | None:
        """The Session, unless there is none or it broke."""
        session = self.session
        return None if session is None or session.broken else session

    def _hold_moved(self, first: bool) -> None:
        session = self.session
        if session is not None and not session.broken:
            session.hold_moved(first)

    async def ensure_session(self) -> None:
        if self.closed:
            raise engine_unavailable("the gateway is shutting down")
        session = self.session
        if session is not None and not session.broken:
            return
        await self._connecting.run(self._connect)

    def stub(self) -> pb_grpc.EngineStub:
        """The channel's stub; a fresh channel when there is none or it went stale."""
        if self.channel is None or self._stale:
            old = self.channel
            self.channel = grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS)
            self._stub = pb_grpc.EngineStub(self.channel)
            self._stale = False
            if old is not None:
                self._spawn(old.close(grace=None))
        assert self._stub is not None
        return self._stub

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _connect(self) -> None:
        models = await self._prepare()  # the engine answers: it is reachable
        if self.closed:
            raise engine_unavailable("the gateway is shutting down")
        link = await self._open_lane() if self.session_lane == "auto" else None
        if self.closed:
            if link is not None:
                link.close()
            raise engine_unavailable("the gateway is shutting down")
        if link is not None:
            self.session = LaneSession(link, self._on_session_broken, self._probe,
                                       self.backlog)
            self.session.on_metrics = self._on_metrics
        else:
            self.session = GrpcSession(self.stub(), self._on_session_broken,
                                       self._probe, self.backlog, self._metadata)
        log.info("engine session open to %s (%d models) over %s", self.target,
                 models, "the session lane" if link is not None else "gRPC")

    async def _open_lane(self) -> LaneLink | None:
        """The engine's Session lane when it has one on this host and it answers; else
        None, with the reason logged once (until it changes)."""
        mine = clock_id()
        try:
            info = await self.stub().SessionLane(
                pb.SessionLaneRequest(), timeout=self._connect_timeout, wait_for_ready=False,
                metadata=self._metadata)
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

    def _on_session_broken(self, session: Session) -> None:
        if session is self.session:
            self._stale = True  # the next request builds a fresh channel

    async def unary(self, name: str, request: Any, timeout: float, metadata=None) -> Any:
        """One unary call; its failure as a GatewayError (an unreachable engine marks the
        channel stale unless a live Session says otherwise)."""
        stub = self.stub()
        try:
            return await getattr(stub, name)(request, timeout=timeout, wait_for_ready=False,
                                             metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            err = from_grpc_error(exc)
            if err.kind is ErrorKind.ENGINE_UNAVAILABLE:
                session = self.session
                if session is None or session.broken:
                    self._stale = True
            raise err from None

    def connect_soon(self) -> None:
        """Open the Session now, in the background (a gateway starting: its first requests
        need not wait for it, which would make their first tokens late); a failure is left
        to the first request, which connects again."""
        if self.session is None and not self._connecting.running and not self.closed:
            self._spawn(self._connect_quietly())

    async def _connect_quietly(self) -> None:
        try:
            await self.ensure_session()
        except Exception as exc:  # (GatewayError and the like: the first request says it)
            log.debug("engine session not opened at start: %s", exc)

    async def close(self) -> None:
        """Close the Session (its requests fail: the gateway is shutting down), then the
        channel."""
        self.closed = True
        session, self.session = self.session, None
        if session is not None:
            session.close("the gateway is shutting down", shutdown=True)
            session.task.cancel()
            await asyncio.gather(session.task, return_exceptions=True)
        if self.channel is not None:
            await self.channel.close(grace=None)
            self.channel = None

    async def settle(self) -> None:
        """Wait for the background work (old channels closing, a start-up connect)."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
