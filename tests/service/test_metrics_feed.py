"""A replica port's /metrics answered from the gateway's copy (WatchMetrics): the real engine
(in-process, real gRPC, 3 replicas) and the real fleet gateway over real HTTP. Scrapes make
no GetMetrics call; a request's counters show in the scrape that follows its response;
live gauges follow within the documented bound; the engine part of a scrape is the
engine's own render byte for byte; an engine without WatchMetrics is scraped as before."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import grpc
import pytest

from engine_helpers import engine_stub, running_engine
from metrics_helpers import promtool_check, sample
from system_tools import tool
from inference_lab.common.ports import free_port_run
from inference_lab.engine.service import metrics_feed, rpc
from inference_lab.engine.service.metrics_feed import Watchers
from inference_lab.engine.service.rpc import EngineService
from inference_lab.gateway.fleet import FleetGateway
from inference_lab.testing.poll import until
from inference_lab.v1 import engine_pb2 as pb
from inference_lab.v1 import engine_pb2_grpc

MODEL = "gpt-oss-20b"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
BOUND_S = 0.05  # docs/metrics.md: a copy is at most ~50 ms old (40 ms interval + delivery)


@pytest.fixture
def get_metrics_calls(monkeypatch) -> list[int]:
    """GetMetrics calls the engine answers (patched before the engine registers it)."""
    calls: list[int] = []
    original = EngineService.GetMetrics

    async def counted(self, request, context):
        calls.append(1)
        return await original(self, request, context)

    monkeypatch.setattr(EngineService, "GetMetrics", counted)
    return calls


async def fleet(replicas: int = 3, session_lane: str | None = None):
    engine_cm = running_engine(replicas=replicas)
    engine = await engine_cm.__aenter__()
    base = free_port_run(replicas)
    gateway = FleetGateway(f"127.0.0.1:{engine.port}", "127.0.0.1", base,
                           session_lane=session_lane)
    await gateway.start()
    http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))

    async def closed() -> None:
        await http.close()
        await gateway.stop()
        await engine_cm.__aexit__(None, None, None)

    await until(lambda: gateway.port_of(replicas - 1) is not None, timeout=10, interval=0.02,
                what="every replica's port open")
    return engine, http, [f"http://127.0.0.1:{base + i}" for i in range(replicas)], closed


async def scrape(http, url: str) -> str:
    async with http.get(url + "/metrics") as resp:
        assert resp.status == 200
        return await resp.text()


@pytest.mark.parametrize("woken", [True, False], ids=["push-behind-batch", "push-on-interval"])
async def test_scrapes_come_from_the_copy_and_show_a_finished_request_at_once(
        woken, get_metrics_calls, monkeypatch):
    if woken:  # no full look for 30 s: only the partial push behind the batch can show it
        monkeypatch.setattr(metrics_feed, "DEFAULT_INTERVAL_S", 30.0)
    else:  # the push comes only with the next full look: the scrape waits for it
        monkeypatch.setattr(Watchers, "finished_on", lambda self, *args, **kwargs: False)
    engine, http, urls, closed = await fleet()
    try:
        first = await scrape(http, urls[1])  # starts the feed
        done = sample(first, "vllm:request_success_total", engine="1", model_name=MODEL,
                      finished_reason="length")
        for tokens in (3, 9):
            async with http.post(urls[1] + "/v1/chat/completions",
                                 json={**CHAT, "max_tokens": tokens}) as resp:
                assert resp.status == 200
            started = time.monotonic()
            text = await scrape(http, urls[1])  # right after the response: it shows
            assert time.monotonic() - started < 0.9  # not the fallback (the feed's deadline: 1 s)
            assert sample(text, "vllm:request_success_total", engine="1", model_name=MODEL,
                          finished_reason="length") == done + 1
            done += 1
        assert sample(text, "vllm:generation_tokens_total", engine="1",
                      model_name=MODEL) == 12
        assert sample(text, "vllm:e2e_request_latency_seconds_count", engine="1",
                      model_name=MODEL) == 2
        for url in urls:
            for _ in range(20):
                await scrape(http, url)
        assert get_metrics_calls == []  # 60+ scrapes, no engine call
        if not woken:  # (with no full look for 30 s, later changes are not pushed)
            # the engine's part is the engine's own render of that replica, byte for byte
            await until(lambda: scrape_starts_with(http, urls[1],
                                                   engine.metrics.render(None, [1]).decode()),
                        timeout=2, interval=0.01, what="the copy equal to the engine's render")
        if tool("promtool", optional=True) is not None:
            assert promtool_check(await scrape(http, urls[1]))[1] == []
    finally:
        await closed()


async def scrape_starts_with(http, url: str, rendered: str) -> bool:
    return (await scrape(http, url)).startswith(rendered)


async def test_a_live_gauge_follows_within_the_bound(get_metrics_calls):
    engine, http, urls, closed = await fleet()
    try:
        await scrape(http, urls[2])
        async with http.post(urls[2] + "/v1/chat/completions",
                             json={**CHAT, "max_tokens": 4000, "stream": True}) as stream:
            assert (await stream.content.readline()).startswith(b"data: ")  # running now
            started = time.monotonic()
            running = 0.0
            while running != 1.0 and time.monotonic() - started < 5:
                running = sample(await scrape(http, urls[2]), "vllm:num_requests_running",
                                 engine="2", model_name=MODEL)
            waited = time.monotonic() - started
        assert running == 1.0
        assert waited < 0.9, waited  # the bound is ~50 ms; generous for a loaded machine
        assert get_metrics_calls == []
    finally:
        await closed()


async def test_watch_metrics_pushes_every_replica_then_changes_and_gone_ones():
    async with running_engine(replicas=3) as engine, engine_stub(engine) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await anext(aiter(stub.WatchMetrics(pb.WatchMetricsRequest(interval_s=0.001))))
        assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "interval_s" in bad.value.details()
        call = stub.WatchMetrics(pb.WatchMetricsRequest(interval_s=0.005))
        first = await call.read()
        assert sorted(r.engine for r in first.replicas) == [0, 1, 2] and not first.gone
        texts = {r.engine: r.text for r in first.replicas}
        assert texts[1] == engine.metrics.render(None, [1])
        await stub.SetReplicas(pb.SetReplicasRequest(replicas=2))  # replica 2 drains, closes
        gone: list[int] = []
        while not gone:
            push = await asyncio.wait_for(call.read(), 5)
            assert push.seq >= first.seq
            gone = list(push.gone)
        assert gone == [2]
        call.cancel()


async def test_an_engine_without_watch_metrics_is_scraped_with_get_metrics(
        monkeypatch, get_metrics_calls):
    monkeypatch.setattr(EngineService, "WatchMetrics",
                        engine_pb2_grpc.EngineServicer.WatchMetrics)
    engine, http, urls, closed = await fleet(replicas=2)
    try:
        for _ in range(3):
            text = await scrape(http, urls[1])
            assert 'vllm:num_requests_waiting{engine="1",model_name="gpt-oss-20b"}' in text
        assert len(get_metrics_calls) == 3
    finally:
        await closed()


async def test_a_crashed_replica_starts_its_counters_over_as_get_metrics_does(get_metrics_calls):
    engine, http, urls, closed = await fleet()
    try:
        async with http.post(urls[1] + "/v1/chat/completions",
                             json={**CHAT, "max_tokens": 7}) as resp:
            assert resp.status == 200
        text = await scrape(http, urls[1])
        assert sample(text, "vllm:generation_tokens_total", engine="1", model_name=MODEL) == 7
        async with http.post(urls[0] + "/control/faults/replica",
                             json={"fault": "crash", "replica": 1}) as resp:
            assert resp.status == 200
        # the replica's new metrics (as the engine's own port and GetMetrics show them)
        await until(lambda: scrape_starts_with(http, urls[1],
                                               engine.metrics.render(None, [1]).decode()),
                    timeout=2, interval=0.01, what="the restarted replica's series")
        text = await scrape(http, urls[1])
        assert sample(text, "vllm:generation_tokens_total", engine="1", model_name=MODEL) == 0
        assert sample(await scrape(http, urls[2]), "vllm:generation_tokens_total", engine="2",
                      model_name=MODEL) == 0  # (the others untouched, from the same copy)
        assert get_metrics_calls == []
    finally:
        await closed()


async def test_the_feed_stops_when_nobody_scrapes(monkeypatch, get_metrics_calls):
    from inference_lab.gateway import metrics_feed as gateway_feed

    monkeypatch.setattr(gateway_feed, "IDLE_S", 0.2)
    engine, http, urls, closed = await fleet(replicas=2)
    try:
        await scrape(http, urls[1])
        assert len(engine.service.watchers.watches) == 1  # one watch for every replica
        await until(lambda: not engine.service.watchers.watches, timeout=5, interval=0.05,
                    what="the engine's watch to end")
        assert 'engine="1"' in await scrape(http, urls[1])  # the next scrape starts it again
        assert len(engine.service.watchers.watches) == 1 and get_metrics_calls == []
    finally:
        await closed()


async def test_an_arrival_at_a_stalled_replica_shows_in_its_waiting_gauge(
        get_metrics_calls, monkeypatch):
    """No step runs (the replica is stalled): only the admission moved the gauge (and the
    once-a-second look at every key is pushed out of the way)."""
    monkeypatch.setattr(metrics_feed, "SAFETY_LOOK_S", 30.0)
    engine, http, urls, closed = await fleet()
    try:
        await scrape(http, urls[2])
        async with http.post(urls[0] + "/control/faults/replica",
                             json={"fault": "stall", "seconds": 30, "replica": 2}) as resp:
            assert resp.status == 200
        # time passing is what is tested: the feed's looks go on meanwhile, nothing moving
        await asyncio.sleep(0.1)
        stuck = asyncio.ensure_future(http.post(urls[2] + "/v1/chat/completions",
                                                json={**CHAT, "max_tokens": 2}))
        started = time.monotonic()
        await until(lambda: waiting_on(http, urls[2]), timeout=2, interval=0.005,
                    what="replica 2's waiting gauge at 1")
        assert time.monotonic() - started < 0.9
        async with http.post(urls[0] + "/control/faults/replica",
                             json={"fault": "clear"}) as resp:
            assert resp.status == 200
        async with await stuck as resp:
            assert resp.status == 200
        assert get_metrics_calls == []
    finally:
        await closed()


async def waiting_on(http, url: str) -> bool:
    return sample(await scrape(http, url), "vllm:num_requests_waiting", engine="2",
                  model_name=MODEL) == 1.0


@pytest.fixture
def slow_watch(monkeypatch) -> None:
    """WatchMetrics' partial pushes 0.3 s late, and no full look for 30 s: a copy that is
    not behind a finish then can only have come another way."""
    monkeypatch.setattr(metrics_feed, "DEFAULT_INTERVAL_S", 30.0)
    original = rpc.watch

    async def slow(metrics, watchers, interval):
        async for push in original(metrics, watchers, interval):
            if push.partial:  # (late on purpose: the lateness is what is tested)
                await asyncio.sleep(0.3)
            yield push

    monkeypatch.setattr(rpc, "watch", slow)


@pytest.mark.parametrize("lane", ["auto", "off"])
async def test_over_the_lane_a_scrape_after_a_response_never_waits_for_the_copy(
        lane, slow_watch, get_metrics_calls):
    """Over the Session lane the batch that finishes a request carries its replica's copy
    (ProgressBatch.metrics): the scrape right after the response has it without waiting for
    WatchMetrics. Over gRPC the copy still comes on the watch, and the scrape waits for it
    (counted: inference_lab_gateway_metrics_copy_waits_total)."""
    engine, http, urls, closed = await fleet(session_lane=lane)
    try:
        first = await scrape(http, urls[1])  # starts the feed
        done = sample(first, "vllm:request_success_total", engine="1", model_name=MODEL,
                      finished_reason="length")
        slowest = 0.0
        for tokens in (2, 5, 3):
            async with http.post(urls[1] + "/v1/chat/completions",
                                 json={**CHAT, "max_tokens": tokens}) as resp:
                assert resp.status == 200
            started = time.monotonic()
            text = await scrape(http, urls[1])
            slowest = max(slowest, time.monotonic() - started)
            done += 1
            assert sample(text, "vllm:request_success_total", engine="1", model_name=MODEL,
                          finished_reason="length") == done
        assert sample(text, "vllm:generation_tokens_total", engine="1", model_name=MODEL) == 10
        waits = sample(text, "inference_lab_gateway_metrics_copy_waits_total")
        if lane == "auto":
            assert waits == 0.0 and slowest < 0.25, slowest
        else:
            assert waits == 3.0 and slowest >= 0.2, slowest  # each waited for the slow push
        assert sample(await scrape(http, urls[2]),
                      "inference_lab_gateway_metrics_copy_waits_total") == 0.0  # per port
        assert get_metrics_calls == []
    finally:
        await closed()


class _Stream:
    """A WatchMetrics call fed by hand (a narrow unit test of the gateway's copy)."""

    def __init__(self) -> None:
        self.pushes: asyncio.Queue = asyncio.Queue()

    def __aiter__(self):
        return self

    async def __anext__(self):
        return await self.pushes.get()

    def cancel(self) -> None:
        pass


def _push(seq: int, partial: bool = False, **texts: bytes) -> pb.MetricsPush:
    return pb.MetricsPush(seq=seq, partial=partial, replicas=[
        pb.ReplicaMetrics(engine=int(k[1:]), text=v) for k, v in texts.items()])


async def test_the_copy_keeps_a_lane_batchs_text_over_an_older_push_that_crossed_it():
    from inference_lab.gateway.metrics_feed import MetricsFeed

    stream = _Stream()
    feed = MetricsFeed(lambda: stream, timeout=1.0)
    feed.take(_push(3, True, r0=b"dropped"))  # no feed yet: nothing kept
    reading = asyncio.ensure_future(feed.text(0))
    stream.pushes.put_nowait(_push(5, r0=b"a5", r1=b"b5"))
    assert await reading == b"a5" and feed.seqs == {0: 5, 1: 5}
    feed.take(_push(9, True, r0=b"a9"))  # a lane batch's copy, ahead of the stream
    assert await feed.text(0, 9) == b"a9"
    stream.pushes.put_nowait(_push(7, r0=b"a7", r1=b"b7"))  # rendered before it, read after
    await until(lambda: feed.seq == 7, timeout=2, interval=0.001, what="the push of seq 7")
    assert await feed.text(0, 9) == b"a9" and await feed.text(1, 7) == b"b7"
    stream.pushes.put_nowait(pb.MetricsPush(seq=10, gone=[1]))
    stream.pushes.put_nowait(_push(11, r0=b"a11"))
    await until(lambda: feed.seq == 11, timeout=2, interval=0.001, what="the push of seq 11")
    assert await feed.text(0, 9) == b"a11" and await feed.text(1) == b""
    assert feed.waits == {}  # each copy was there when asked
    await feed.close()
