"""The engine's per-replica expositions kept in the gateway, so that a replica port's
/metrics is answered from a local copy with no engine call (an endpoint picker scrapes
every replica every 50 ms; a GetMetrics per scrape crossed two busy processes each time).

Knows: the engine's WatchMetrics stream (engine.proto): a first push of every replica's
text, then the replicas whose text changed (the engine looks every 40 ms) and the ones
gone, and partial pushes of the replicas a Session batch finished requests on, at once
(over the Session lane, those come in the batch itself: `take`). The copy is what the
engine rendered, byte for byte (the same render as GetMetrics with engines = [i]).

How fresh: while the feed is live, a copy is at most the engine's interval (40 ms) plus
the delivery old; and a request's finish is never missed: the Session batch that carried
its Finished says the engine's metrics version then (ProgressBatch.metrics_seq), and a
scrape that comes after waits for a push at least that new (the engine sends it right
behind the batch, or in it on the lane; `waits` counts the scrapes that had to wait). A
copy only ever moves forward: pushes arrive in order on the stream, a text older than the
one held (a lane batch's can overtake the stream) is not applied, and a feed
that broke or timed out is dropped whole; the next one starts after the caller has read
whatever it asked the engine meanwhile, so it renders later than that.

Lifecycle: started by the first scrape; stopped after IDLE_S without one (the engine then
stops looking); dropped when the stream breaks (engine restarted: its numbers start over,
as they do for GetMetrics). Answers None when it cannot answer (no feed within the
deadline, an engine without WatchMetrics, a replica the engine never pushed): the caller
asks GetMetrics then.

`EngineExpositions` is how the engine client reads the engine's expositions: GetMetrics and
WatchMetrics over a channel of their own (a scrape on the Session's channel would wait
behind the token batches the gateway has not read yet), the feed's copy first for a
replica's, GetMetrics when the copy cannot answer.

Does not know: HTTP, what a series means, the Session (the caller passes the version).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Callable

import grpc

from inference_lab.gateway.channel import CHANNEL_OPTIONS
from inference_lab.gateway.errors import ErrorKind, from_grpc_error
from inference_lab.v1 import engine_pb2 as pb
from inference_lab.v1 import engine_pb2_grpc as pb_grpc

log = logging.getLogger("inference_lab.gateway.metrics_feed")

IDLE_S = 10.0  # no scrape for this long: the feed stops (the next scrape starts it again)
# The scrape channel: the Session channel's options, but with a window that takes a whole
# push of every replica's series at once (a message larger than the window waits for
# window updates, a round trip each between two busy processes).
SCRAPE_CHANNEL_OPTIONS = tuple(o for o in CHANNEL_OPTIONS
                               if o[0] not in ("grpc.http2.bdp_probe", "grpc.http2.lookahead_bytes")
                               ) + (("grpc.http2.lookahead_bytes", 16 * 1024 * 1024),)


class MetricsFeed:
    """One WatchMetrics stream and the copy it keeps: replica -> its exposition."""

    def __init__(self, open_call: Callable[[], Any], timeout: float) -> None:
        self._open_call = open_call  # -> a WatchMetrics call (a grpc.aio stream)
        self._timeout = timeout
        self.supported = True  # False once the engine answered UNIMPLEMENTED
        self.texts: dict[int, bytes] = {}  # replica -> text (b"": gone)
        self.seq = -1  # the engine's metrics version of the last full push (-1: none)
        self.seqs: dict[int, int] = {}  # replica -> version of the text held
        self.waits: dict[int, int] = {}  # replica -> scrapes that waited for a newer copy
        self._task: asyncio.Task | None = None
        self._call: Any = None
        self._changed: asyncio.Future | None = None
        self._last_used = 0.0
        self._idle_timer: asyncio.TimerHandle | None = None

    async def text(self, replica: int, seq: int = 0) -> bytes | None:
        """Replica `replica`'s exposition as of the engine's version `seq` or later; None
        when the feed cannot tell (ask GetMetrics)."""
        if not self.supported:
            return None
        loop = asyncio.get_running_loop()
        self._last_used = now = loop.time()
        if self._task is None:
            self._start()
        deadline = now + self._timeout
        if self.seq >= 0 and max(self.seq, self.seqs.get(replica, -1)) < seq:
            self.waits[replica] = self.waits.get(replica, 0) + 1  # behind a finish seen
        while self.seq < 0 or max(self.seq, self.seqs.get(replica, -1)) < seq:
            if self._task is None:  # it ended (broken, or not supported)
                return None
            if self._changed is None:
                self._changed = loop.create_future()
            try:
                async with asyncio.timeout_at(deadline):
                    await asyncio.shield(self._changed)
            except TimeoutError:
                log.warning("no metrics push from the engine within %.1f s", self._timeout)
                self.stop()  # dropped whole: a later one renders after what the caller reads
                return None
        return self.texts.get(replica)

    def ready(self, replica: int, seq: int = 0, keep: bool = True) -> bytes | None:
        """`text` when it would not wait: the copy of `replica` as of `seq` or later
        while the feed is live; None otherwise (ask `text`). `keep` False reads the copy
        without keeping the feed alive for it (a reader that would rather ask now and then
        than have the engine push every change)."""
        if self._task is None or self.seq < 0 or max(self.seq, self.seqs.get(replica, -1)) < seq:
            return None
        text = self.texts.get(replica)
        if text is not None and keep:
            self._last_used = asyncio.get_running_loop().time()
        return text

    def _start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._read(), name="metrics-feed")
        self._arm_idle()

    def _arm_idle(self) -> None:
        self._idle_timer = asyncio.get_running_loop().call_later(IDLE_S, self._check_idle)

    def _check_idle(self) -> None:
        if asyncio.get_running_loop().time() - self._last_used >= IDLE_S:
            self.stop()
        else:
            self._arm_idle()

    async def _read(self) -> None:
        call = self._call = self._open_call()
        try:
            async for push in call:
                self._apply(push)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                self.supported = False  # an older engine: GetMetrics per scrape
            elif exc.code() is not grpc.StatusCode.CANCELLED:
                log.info("metrics feed ended: %s", exc.code().name)
        finally:
            if self._call is call:
                self._reset()

    def take(self, push) -> None:
        """A partial push that came another way (in a Session lane batch, which can
        overtake this stream): kept while the feed is live."""
        if self._task is not None:
            self._apply(push)

    def _apply(self, push) -> None:
        """A push's texts, each unless the copy held of its replica is newer (a partial
        push from the lane and this stream's pushes may cross)."""
        texts, seqs, seq = self.texts, self.seqs, push.seq
        for replica in push.replicas:
            index = replica.engine
            if seqs.get(index, -1) <= seq:
                texts[index] = replica.text
                seqs[index] = seq
        if not push.partial:
            for index in push.gone:
                if seqs.get(index, -1) <= seq:
                    texts[index] = b""
                    seqs[index] = seq
            self.seq = seq
        self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None and not changed.done():
            changed.set_result(None)

    def _reset(self) -> None:
        self._task = self._call = None
        self.texts = {}
        self.seq = -1
        self.seqs = {}
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self._wake()

    def stop(self) -> None:
        """Drop the feed and its copy (the engine's call is cancelled)."""
        call, task = self._call, self._task
        self._reset()
        if call is not None:
            call.cancel()
        if task is not None:
            task.cancel()

    async def close(self) -> None:
        task = self._task
        self.stop()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task


class EngineExpositions:
    """The engine's expositions as this gateway reads them, over the scrape channel.
    `finished_seq(replica)`: the engine's metrics version once the last request this
    gateway saw finish on the replica was counted (0: none)."""

    def __init__(self, target: str, timeout: float,
                 finished_seq: Callable[[int], int]) -> None:
        self.target = target
        self._timeout = timeout
        self._finished_seq = finished_seq
        self._channel: grpc.aio.Channel | None = None  # GetMetrics, WatchMetrics
        self.feed = MetricsFeed(self._watch, timeout)

    def _stub(self) -> pb_grpc.EngineStub:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self.target, options=SCRAPE_CHANNEL_OPTIONS)
        return pb_grpc.EngineStub(self._channel)

    def _watch(self):
        return self._stub().WatchMetrics(pb.WatchMetricsRequest(), wait_for_ready=False)

    async def text(self, models: list[str] | None = None,
                   engines: list[int] | None = None) -> bytes:
        """GetMetrics of `models` on the engines (replicas) `engines` (None: all); empty
        when no model has those replicas."""
        request = pb.GetMetricsRequest(models=models or (), engines=engines or ())
        stub = self._stub()
        try:
            resp = await stub.GetMetrics(request, timeout=self._timeout, wait_for_ready=False)
        except grpc.aio.AioRpcError as exc:
            err = from_grpc_error(exc)
            if err.kind is ErrorKind.MODEL_NOT_FOUND:  # NOT_FOUND: no such replica (any more)
                return b""
            if err.kind is ErrorKind.ENGINE_UNAVAILABLE:  # the next scrape connects afresh
                channel, self._channel = self._channel, None
                self.feed.stop()
                if channel is not None:
                    await channel.close(grace=None)
            raise err from None
        return resp.text

    async def replica(self, replica: int) -> bytes:
        """Replica `replica`'s exposition from the feed's copy, else from GetMetrics."""
        text = await self.feed.text(replica, self._finished_seq(replica))
        if text is None:
            return await self.text(engines=[replica])
        return text

    def replica_now(self, replica: int) -> bytes | None:
        """`replica` when its copy is here already (no wait, no call); else None."""
        return self.feed.ready(replica, self._finished_seq(replica))

    def replica_if_fed(self, replica: int) -> bytes | None:
        """`replica_now` while some scraper keeps the feed live, without keeping it so."""
        return self.feed.ready(replica, self._finished_seq(replica), keep=False)

    def copy_waits(self, replica: int) -> int:
        return self.feed.waits.get(replica, 0)

    async def close(self) -> None:
        await self.feed.close()
        if self._channel is not None:
            await self._channel.close(grace=None)
            self._channel = None
