"""vllm-project's own router (PyPI vllm-router, a Rust binary) in front of the real
`serve --replicas 3`, each policy's documented behaviour asserted on what the lab serves:
round_robin spreads; power_of_two avoids a replica loaded from outside (it polls GET
/get_load); kv_aware keeps each prefix group on the replica that holds its prefix and
spreads the groups (vLLM's render API, KV events), both over independent replicas (one
worker per port, each publishing as rank 0, as independent vLLM servers do) and over the
data-parallel ranks of `serve --data-parallel-size 3` (its DP-aware mode over the one
port, each rank publishing its rank); a 529 reaches the client unchanged and is not
retried. And a reproduction, with a fake worker sending vLLM's own events, of the
router's rule that credits a plain worker's events only when they say rank 0
(docs/routers.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time

import aiohttp
import msgspec
import pytest
import zmq
from aiohttp import web

from inference_lab.common.ports import free_port, free_port_run
from inference_lab.engine.service.kv_events import BlockStored, KVEventBatch
from inference_lab.testing.launch import serve
from inference_lab.testing.poll import until
from inference_lab.testing.routers import (
    MODEL, held_streams, loaded_replica, metric, replica_of, router_command, system_prompt,
    through, vllm_router,
)

pytestmark = [pytest.mark.skipif(router_command() is None,
                                 reason="vllm-router not installed (pip install vllm-router)"),
              pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def lab():
    """`serve --replicas 3` with KV events (replica k's publisher on kv + 2k, replays on
    kv + 1 + 2k; vLLM's default topic, ""): (replica URLs, kv)."""
    kv = free_port_run(6)
    config = json.dumps({"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{kv}",
                         "replay_endpoint": f"tcp://127.0.0.1:{kv + 1}"})
    with serve("--replicas", "3", "--kv-events-config", config, ports=3) as served:
        yield [f"http://127.0.0.1:{served.port + i}" for i in range(3)], kv


@pytest.fixture(scope="module")
def dp_lab():
    """`serve --data-parallel-size 3` with KV events: three engine processes behind one
    port (rank k's publisher on kv + 2k, replays on kv + 1 + 2k): (base URL, kv)."""
    kv = free_port_run(6)
    config = json.dumps({"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{kv}",
                         "replay_endpoint": f"tcp://127.0.0.1:{kv + 1}"})
    with serve("--data-parallel-size", "3", "--kv-events-config", config) as served:
        yield f"http://127.0.0.1:{served.port}", kv


def session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))


def question(i: int, max_tokens: int = 8) -> dict:
    return {"model": MODEL, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": f"question {i}"}]}


async def test_round_robin_spreads_requests_over_every_replica(lab):
    replicas, _ = lab
    with vllm_router(replicas, "round_robin") as router:
        async with session() as http:
            served = await through(http, f"http://127.0.0.1:{router.port}",
                                   [question(i) for i in range(9)], at_once=1)
    assert [resp.status for resp in served] == [200] * 9
    assert sorted(replica_of(resp) for resp in served) == ["0"] * 3 + ["1"] * 3 + ["2"] * 3


async def test_power_of_two_avoids_a_replica_loaded_from_outside(lab):
    # 8 streams straight to replica 0: the router sees them only through GET /get_load
    # (without it, replica 0 gets a third of what is routed); once it has polled, 12
    # requests 4 at a time go to replicas 1 and 2.
    replicas, _ = lab
    with vllm_router(replicas, "power_of_two") as router:
        async with session() as http:
            served = await loaded_replica(http, replicas, f"http://127.0.0.1:{router.port}",
                                          streams=8, routed=12, at_once=4, max_tokens=16)
    assert served.count("0") <= 2, served
    assert {"1", "2"} <= set(served)


def dp_aware(replicas: list[str], kv: int) -> list[str]:
    base = replicas[0]
    pubs = ",".join(f"tcp://127.0.0.1:{kv + 2 * k}" for k in range(3))
    replays = ",".join(f"tcp://127.0.0.1:{kv + 1 + 2 * k}" for k in range(3))
    return ["--intra-node-data-parallel-size", "3", "--kv-event-source", f"{base}={pubs}",
            "--kv-event-replay-source", f"{base}={replays}", "--kv-event-block-size", "64",
            "--kv-event-model", MODEL]


async def _prefix_groups_through(url: str, base: int = 0) -> None:
    """The first request of each of 3 groups (800-token system prompts), all at once and
    long enough to overlap, cold everywhere: the router spreads them by load. Then 3 more
    of each group, one at a time: each credited on the replica (rank) that holds its
    group's prefix (its KV events), and served there."""
    def body(group: int, i: int, max_tokens: int = 8) -> dict:
        return {"model": MODEL, "max_tokens": max_tokens, "messages": [
            {"role": "system", "content": system_prompt(base + group, 800)},
            {"role": "user", "content": f"question {i}"}]}

    async with session() as http:  # the first three last ~0.5 s: they overlap
        first = await through(http, url, [body(g, 0, 300) for g in range(3)], at_once=3)
        homes = [replica_of(resp) for resp in first]
        later = await through(http, url, [body(g, i) for i in range(1, 4) for g in range(3)],
                              at_once=1)
    assert [resp.status for resp in first + later] == [200] * 12
    assert len(set(homes)) >= 2, homes  # the groups spread
    assert [replica_of(resp) for resp in later] == homes * 3  # each group at its home
    cached = [json.loads(resp.body)["usage"]["prompt_tokens_details"]["cached_tokens"]
              for resp in later]
    assert min(cached) >= 768, cached  # its 12 whole blocks of the system prompt


async def test_kv_aware_credits_independent_replicas_one_worker_per_port(lab):
    # each replica port a worker of its own, discovered without flags (/get_server_info,
    # /kv_event_sources): every replica publishes as rank 0, so every one is credited
    replicas, _ = lab
    with vllm_router(replicas, "kv_aware") as router:
        await _prefix_groups_through(f"http://127.0.0.1:{router.port}")


async def test_kv_aware_credits_data_parallel_ranks_behind_one_port(dp_lab):
    # DP-aware: one worker, the one port, its three ranks addressed by X-data-parallel-
    # rank, every rank's publisher given in rank order; each rank's batches say its rank
    url, kv = dp_lab
    async with session() as http:  # the one port lists every rank's publisher
        async with http.get(url + "/kv_event_sources") as resp:
            sources = await resp.json()
    assert {rank: s["endpoint"] for rank, s in sources.items()} == {
        str(k): f"tcp://127.0.0.1:{kv + 2 * k}" for k in range(3)}
    with vllm_router([url], "kv_aware", *dp_aware([url] * 3, kv)) as router:
        await _prefix_groups_through(f"http://127.0.0.1:{router.port}")


async def test_a_529_reaches_the_client_unchanged_and_is_not_retried(lab):
    replicas, _ = lab
    one = replicas[1]
    async with session() as http:
        async with http.post(one + "/control/capacity",
                             json={"max_num_seqs": 1, "max_waiting": 1}) as resp:
            assert resp.status == 200
        waiting = None
        try:
            async with held_streams(http, one, 1):  # one running, one waiting: full
                waiting = asyncio.get_running_loop().create_task(
                    http.post(one + "/v1/chat/completions", json={**question(0), "stream": True}))
                await until(lambda: _load(http, one, 2), what="a request waiting on replica 1")
                async with http.post(one + "/v1/chat/completions", json=question(0)) as resp:
                    direct = (resp.status, resp.headers["content-type"], await resp.read())
                assert direct[0] == 529
                with vllm_router([one], "round_robin", "--cb-failure-threshold", "100") as router:
                    refusals = await metric(http, one + "/metrics",
                                            "inference_lab_gateway_http_requests_total",
                                            route="/v1/chat/completions", status="529")
                    [routed] = await through(http, f"http://127.0.0.1:{router.port}",
                                             [question(0)], at_once=1)
                    assert (routed.status, routed.headers["content-type"], routed.body) == direct
                    assert replica_of(routed) == "1"
                    after = await metric(http, one + "/metrics",
                                         "inference_lab_gateway_http_requests_total",
                                         route="/v1/chat/completions", status="529")
                    assert after - refusals == 1  # asked once: a 529 is not retried
        finally:
            if waiting is not None:
                waiting.cancel()
            async with http.post(one + "/control/capacity",
                                 json={"max_num_seqs": 256, "max_waiting": 0}) as resp:
                assert resp.status == 200


async def _load(http, replica: str, n: int) -> bool:
    async with http.get(replica + "/get_load") as resp:
        return (await resp.json())["load"] == n


# ---- the router's defect, reproduced without the lab ----------------------------------------
# The worker speaks vLLM's KV event wire types (vllm/distributed/kv_events.py), encoded by
# the lab's copy of them (engine.service.kv_events), with int block hashes
# (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES).


@contextlib.contextmanager
def fake_vllm_worker(rank: int, block: int, prompt: list[int]):
    """A worker as a vLLM rank `rank` would answer vllm-router (server info, its
    KV-event source, completions), whose publisher says, again and again (a PUB socket
    drops what precedes a subscription), that it stored `prompt`'s blocks. It runs on an
    event loop of its own, in a thread (the router's start-up is waited for blocking)."""
    pub_port, port = free_port(), free_port()
    hashes = list(range(1, len(prompt) // block + 1))
    payload = msgspec.msgpack.encode(KVEventBatch(time.time(), [BlockStored(
        hashes, None, prompt[:len(hashes) * block], block, None, "GPU", None)], rank))
    usage = {"prompt_tokens": len(prompt), "completion_tokens": 1, "total_tokens": len(prompt) + 1}
    answers = {
        "/health": {"status": "ok"},
        "/get_server_info": {"model_id": MODEL, "instance_id": f"fake-{rank}",
                             "kv_block_size": block},
        "/kv_event_sources": {str(rank): {
            "endpoint": f"tcp://127.0.0.1:{pub_port}", "topic": "", "publisher": "zmq",
            "encoding": "msgpack", "schema_version": 1}},
        "/v1/completions": {"id": "cmpl-1", "object": "text_completion", "model": MODEL,
                            "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
                            "usage": usage},
    }
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def main() -> None:
        async def answer(request):
            return web.json_response(answers[request.path])

        app = web.Application()
        for path in answers:
            app.router.add_route("*", path, answer)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ctx = zmq.Context()
        pub = ctx.socket(zmq.PUB)
        pub.bind(f"tcp://127.0.0.1:{pub_port}")
        try:
            for seq in range(2000):  # bounded: 100 s at most
                pub.send_multipart((b"", seq.to_bytes(8, "big"), payload))
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.05)
                if stop.is_set():
                    break
        finally:
            pub.close(0)
            ctx.term()
            await runner.cleanup()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)


CREDIT = re.compile(r"KV request selected.*? new_prefill_tokens=(\d+)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the router colours its console log, always


@pytest.mark.parametrize("rank, credited", [(0, True), (1, False)])
async def test_vllm_router_credits_only_kv_events_of_rank_0_on_a_plain_worker(rank, credited):
    """The same vLLM-shaped events, once from rank 0 and once from rank 1 (as a vLLM
    data-parallel rank serving its own port publishes them): the router stores rank 1's
    under rank 1 but a plain worker's target is rank 0, so the prefix is never credited
    (its log's `new_prefill_tokens` stays the whole prompt)."""
    block, prompt = 16, list(range(1000, 1064))  # 4 blocks, sent as token IDs
    with fake_vllm_worker(rank, block, prompt) as worker, \
            vllm_router([worker], "kv_aware", "--log-level", "debug") as router:
        url = f"http://127.0.0.1:{router.port}/v1/completions"
        async with session() as http:
            seen: list[int] = []
            for _ in range(20):  # bounded: 20 decisions, 0.1 s apart
                async with http.post(url, json={"model": MODEL, "prompt": prompt,
                                                "max_tokens": 1}) as resp:
                    assert resp.status == 200
                seen = [int(n) for n in CREDIT.findall(ANSI.sub("", router.log()))]
                if min(seen, default=len(prompt)) < len(prompt):
                    break
                # (the wait is the test's window: for a rank the router ignores, no
                # event announces that it credited nothing)
                await asyncio.sleep(0.1)
        assert f"subscriber for fake-{rank} rank{rank}" in ANSI.sub("", router.log())
        assert seen and (min(seen) < len(prompt)) is credited, seen


async def test_kv_aware_discovers_every_rank_s_publisher_from_the_one_port(dp_lab):
    # no static sources: the router reads /kv_event_sources of the one port, which lists
    # every rank's publisher under its rank
    url, _ = dp_lab
    with vllm_router([url], "kv_aware", "--intra-node-data-parallel-size", "3") as router:
        await _prefix_groups_through(f"http://127.0.0.1:{router.port}", base=10)
