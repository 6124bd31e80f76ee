"""`serve` over several processes, for real: data-parallel ranks (one engine process
each) behind one port with two API servers sharing it, each rank admitting and refusing
on its own queue in arrival order; one scrape with every rank's series; per-rank capacity
that survives a rank's restart; ranks on ports of their own for a router
(--data-parallel-external-lb); independent replicas spread over engine processes, live
scaling included."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from metrics_helpers import promtool_check
from inference_lab.testing.launch import serve
from inference_lab.testing.poll import until, wait_until

MODEL = "gpt-oss-20b"
pytestmark = pytest.mark.timeout(180)


def chat(max_tokens: int = 4, stream: bool = False) -> dict:
    return {"model": MODEL, "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "user", "content": "hello"}]}


def rank_of(resp: aiohttp.ClientResponse) -> int:
    return int(resp.headers["x-inference-lab-replica"])


@pytest.fixture(scope="module")
def dp(tmp_path_factory):
    state = tmp_path_factory.mktemp("state")
    with serve("--data-parallel-size", "2", "--api-server-count", "2",
               "--state-dir", str(state)) as served:
        yield served


async def capacity(http: aiohttp.ClientSession, base: str, **query) -> list[dict]:
    async with http.get(base + "/control/capacity", params=query) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def set_capacity(http: aiohttp.ClientSession, base: str, body: dict) -> tuple[int, object]:
    async with http.post(base + "/control/capacity", json=body) as resp:
        return resp.status, await resp.json()


async def test_every_rank_is_an_engine_process_of_its_own_behind_two_api_servers(dp):
    assert len(set(dp.engine_pids())) == 2  # one engine core per rank
    assert len(set(dp.api_server_pids())) == 2  # two gateways share the one port
    base = f"http://127.0.0.1:{dp.port}"
    async with aiohttp.ClientSession() as http:
        rows = await capacity(http, base)
        assert [(r["model"], r["rank"]) for r in rows] == [(MODEL, 0), (MODEL, 1)]
        assert [r["rank"] for r in await capacity(http, base, rank="1")] == [1]
        async with http.get(base + "/control/capacity", params={"rank": "x"}) as resp:
            assert resp.status == 400 and "rank" in (await resp.json())["error"]["message"]
        async with http.get(base + "/control/replicas") as resp:  # the ranks, as replicas
            assert [r["replica"] for r in await resp.json()] == [0, 1]
        async with http.post(base + "/control/replicas", json={"replicas": 1}) as resp:
            assert resp.status == 400  # the ranks are fixed at start
            assert "--data-parallel-size" in (await resp.json())["error"]["message"]
        assert [r["rank"] for r in await capacity(http, base)] == [0, 1]


async def test_requests_naming_no_rank_are_balanced_and_a_header_pins_one(dp):
    base = f"http://127.0.0.1:{dp.port}"
    async with aiohttp.ClientSession() as http:
        # one at a time on an idle fleet: each API server deals its picks out round robin
        # (vLLM's balancer: every pick counts as waiting there until the next publication)
        ranks = []
        for _ in range(8):
            async with http.post(base + "/v1/chat/completions", json=chat()) as resp:
                assert resp.status == 200
                ranks.append(rank_of(resp))
        assert set(ranks) == {0, 1}, ranks
        for rank in (0, 1, 1, 0):
            async with http.post(base + "/v1/chat/completions", json=chat(),
                                 headers={"X-data-parallel-rank": str(rank)}) as resp:
                assert resp.status == 200 and rank_of(resp) == rank
        async with http.post(base + "/v1/chat/completions", json=chat(),
                             headers={"X-data-parallel-rank": "5"}) as resp:
            assert resp.status == 404, await resp.text()


async def test_a_full_rank_refuses_on_its_own_queue_while_the_other_admits(dp):
    # rank 1: one running place, one waiting place; rank 0 untouched. Three endless
    # streams pinned to rank 1, each sent once the previous one is in the engine: the
    # first runs, the second waits, the third is refused before any byte, with rank 1's
    # own numbers; rank 0 still admits, and nothing was refused on it.
    base = f"http://127.0.0.1:{dp.port}"
    pin = {"X-data-parallel-rank": "1"}
    async with aiohttp.ClientSession() as http:
        status, rows = await set_capacity(http, base, {"rank": 1, "max_num_seqs": 1,
                                                       "max_waiting": 1})
        assert status == 200 and [(r["rank"], r["max_num_seqs"], r["max_waiting"])
                                  for r in rows] == [(1, 1, 1)]
        held = []
        try:
            for depth in (1, 2):
                held.append(await http.post(base + "/v1/chat/completions",
                                            json=chat(100_000, stream=True), headers=pin))
                assert held[-1].status == 200

                async def queued(depth=depth) -> bool:
                    row, = await capacity(http, base, rank="1")
                    return row["running"] + row["waiting"] == depth

                await until(queued, what=f"{depth} request(s) on rank 1")
            async with http.post(base + "/v1/chat/completions", json=chat(), headers=pin) as resp:
                assert resp.status == 529
                message = (await resp.json())["error"]["message"]
                assert "1 requests waiting (max_waiting = 1)" in message, message
            async with http.post(base + "/v1/chat/completions", json=chat(),
                                 headers={"X-data-parallel-rank": "0"}) as resp:
                assert resp.status == 200
        finally:
            for resp in held:
                resp.close()
            await set_capacity(http, base, {"max_num_seqs": 256, "max_waiting": 0})
        # A 529 the gateway answers on the engine's word reaches the engine's counter a
        # moment later (gateway.admission reports its refusals in batches): wait for it.
        refused: dict[str | None, float] = {}

        async def counted() -> bool:
            async with http.get(base + "/metrics") as resp:
                text = await resp.text()
            refused.clear()
            refused.update({s.labels.get("engine"): s.value
                            for f in text_string_to_metric_families(text) for s in f.samples
                            if s.name == "inference_lab_rejections_total"
                            and s.labels.get("reason") == "QUEUE_SATURATED"})
            return refused.get("1", 0) >= 1

        await until(counted, what="rank 1's refusal in the scrape")
    assert refused.get("0", 0) == 0 and refused.get("1", 0) == 1, refused


async def test_one_scrape_shows_every_rank_and_passes_promtool(dp):
    base = f"http://127.0.0.1:{dp.port}"
    async with aiohttp.ClientSession() as http:
        async with http.get(base + "/metrics") as resp:
            assert resp.status == 200
            text = await resp.text()
    engines = {s.labels["engine"] for f in text_string_to_metric_families(text)
               for s in f.samples if s.name == "vllm:num_requests_running"}
    assert engines == {"0", "1"}
    assert promtool_check(text)[1] == []  # parses; only vLLM's own names are linted


async def test_a_rank_restarted_keeps_its_live_capacity(dp):
    base = f"http://127.0.0.1:{dp.port}"
    async with aiohttp.ClientSession() as http:
        status, _ = await set_capacity(http, base, {"rank": 1, "max_num_seqs": 7})
        assert status == 200
        victim = dp.engine_pids()[1]
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: len(dp.engine_pids()) == 3, timeout=30, what="rank 1 restarted")

        async def restored() -> bool:
            try:
                rows = await capacity(http, base)
            except (AssertionError, aiohttp.ClientError):
                return False
            return [r["max_num_seqs"] for r in rows] == [256, 7]

        await until(restored, timeout=30, what="rank 1 back with max_num_seqs 7")
        await set_capacity(http, base, {"max_num_seqs": 256})


def test_external_load_balancing_puts_each_rank_on_a_port_of_its_own():
    with serve("--data-parallel-size", "2", "--data-parallel-external-lb", ports=2) as served:
        async def check() -> None:
            async with aiohttp.ClientSession() as http:
                for rank in (0, 1):
                    url = f"http://127.0.0.1:{served.port + rank}"
                    await until(lambda url=url: _ok(http, url + "/health/ready"),
                                what=f"rank {rank}'s port")
                    async with http.get(url + "/get_server_info") as resp:
                        assert (await resp.json())["data_parallel_rank"] == rank
                    async with http.post(url + "/v1/chat/completions", json=chat()) as resp:
                        assert resp.status == 200 and rank_of(resp) == rank

        asyncio.run(check())
        assert len(set(served.engine_pids())) == 2


async def _ok(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url) as resp:
            return resp.status == 200
    except aiohttp.ClientError:
        return False


def test_replicas_spread_over_engine_processes_and_scale_live():
    # --replicas 2 over 2 engine processes (replica i in process i mod 2); scaling to 3
    # adds replica 2 in process 0, its port opens; back to 2 closes it
    with serve("--replicas", "2", "--engine-processes", "2", ports=3) as served:
        assert len(set(served.engine_pids())) == 2

        async def check() -> None:
            async with aiohttp.ClientSession() as http:
                base = f"http://127.0.0.1:{served.port}"
                await until(lambda: _ok(http, f"http://127.0.0.1:{served.port + 1}/health/ready"),
                            what="replica 1's port")
                for index in (0, 1):
                    url = f"http://127.0.0.1:{served.port + index}"
                    async with http.post(url + "/v1/chat/completions", json=chat()) as resp:
                        assert resp.status == 200 and rank_of(resp) == index
                async with http.post(base + "/control/replicas", json={"replicas": 3}) as resp:
                    assert resp.status == 200, await resp.text()
                    rows = await resp.json()
                assert [(r["replica"], r["port"]) for r in rows] == [
                    (i, served.port + i) for i in range(3)]
                url = f"http://127.0.0.1:{served.port + 2}"
                async with http.post(url + "/v1/chat/completions", json=chat()) as resp:
                    assert resp.status == 200 and rank_of(resp) == 2
                async with http.get(base + "/get_server_info") as resp:
                    assert (await resp.json())["data_parallel_rank"] == 0  # independent servers
                async with http.post(base + "/control/replicas", json={"replicas": 2}) as resp:
                    assert resp.status == 200
                    assert [r["replica"] for r in await resp.json()
                            if not r["draining"]] == [0, 1]

        asyncio.run(check())


def test_contradicting_scale_flags_are_refused_naming_them():
    import subprocess
    import sys

    cases = [(["--replicas", "2", "--data-parallel-size", "2"], "--replicas and --data-parallel-size"),
             (["--data-parallel-external-lb"], "need --data-parallel-size > 1"),
             (["--data-parallel-size", "2", "--data-parallel-start-rank", "2"], "must be within"),
             (["--replicas", "2", "--kv-roles", "1:1", "--engine-processes", "2"],
              "--engine-processes must be 1")]
    for flags, words in cases:
        done = subprocess.run([sys.executable, "-P", "-m", "inference_lab", "serve", *flags],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, (flags, done.stderr)
        assert words in done.stderr and "Traceback" not in done.stderr, (flags, done.stderr)


def test_counter_of_ranks_is_even_over_a_burst_through_both_api_servers(dp):
    # 40 requests at once without a rank: vLLM's balancer in each API server adds each
    # pick to its estimate, so the two ranks share the burst (neither gets it all)
    base = f"http://127.0.0.1:{dp.port}"

    async def burst() -> Counter:
        async with aiohttp.ClientSession() as http:
            async def one():
                async with http.post(base + "/v1/chat/completions", json=chat()) as resp:
                    assert resp.status == 200
                    return rank_of(resp)
            return Counter(await asyncio.gather(*(one() for _ in range(40))))

    counts = asyncio.run(burst())
    assert set(counts) == {0, 1} and min(counts.values()) >= 10, counts


def test_a_burst_is_admitted_exactly_per_rank_in_arrival_order(dp):
    # every rank: 1 running place, 4 waiting; 60 long requests at once, none naming a
    # rank, through both API servers: each rank is sent far more than its places, fills
    # its waiting queue and refuses the rest with its own 529. Never more than its 5
    # places, never fewer than its 4 waiting places (each rank's engine holds its
    # decisions until every request read before them reached it; nothing finishes during
    # the burst, so no place frees); 4 when its first request came while the other rank's
    # step was under way (gpt-oss-20b is an MoE model: its ranks step together, so that
    # request waits for the group's next step, as vLLM's would). Every request sent is
    # admitted or counted refused by its rank's own engine.
    base = f"http://127.0.0.1:{dp.port}"

    async def refused_by_engine(http) -> Counter:
        async with http.get(base + "/metrics") as resp:
            text = await resp.text()
        return Counter({int(s.labels["engine"]): int(s.value)
                        for f in text_string_to_metric_families(text) for s in f.samples
                        if s.name == "inference_lab_rejections_total"
                        and s.labels.get("reason") == "QUEUE_SATURATED"})

    async def run() -> tuple[Counter, Counter, Counter]:
        sent, admitted = Counter(), Counter()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            before = await refused_by_engine(http)
            status, _ = await set_capacity(http, base, {"max_num_seqs": 1, "max_waiting": 4})
            assert status == 200
            try:
                async def one():
                    async with http.post(base + "/v1/chat/completions", json=chat(1000)) as resp:
                        rank = rank_of(resp)
                        sent[rank] += 1
                        assert resp.status in (200, 529), resp.status
                        admitted[rank] += resp.status == 200
                        await resp.read()

                await asyncio.gather(*(one() for _ in range(60)))
            finally:
                await set_capacity(http, base, {"max_num_seqs": 256, "max_waiting": 0})
            after = await refused_by_engine(http)
        after.subtract(before)
        return sent, admitted, after

    sent, admitted, refused = asyncio.run(run())
    assert sum(sent.values()) == 60 and set(sent) == {0, 1}
    assert min(sent.values()) > 5, sent
    assert all(4 <= admitted[r] <= 5 for r in (0, 1)), (sent, admitted)
    assert refused == Counter({r: sent[r] - admitted[r] for r in (0, 1)}), (sent, refused)
