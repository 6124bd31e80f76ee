"""What works on one engine process works across data-parallel ranks in processes of their
own, through the one port: a LoRA adapter loaded once is served by every rank; a replica
fault on one rank slows that rank alone; sleep mode puts every rank to sleep and wakes
every one."""

from __future__ import annotations

import json

import aiohttp
import pytest

from inference_lab.testing.launch import serve

MODEL = "gpt-oss-20b"
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def ranks():
    with serve("--data-parallel-size", "2", "--enable-sleep-mode", "--enable-lora") as served:
        yield f"http://127.0.0.1:{served.port}"


def chat(model: str = MODEL, max_tokens: int = 8) -> dict:
    return {"model": model, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "hello"}]}


async def on_rank(http: aiohttp.ClientSession, base: str, rank: int, body: dict) -> tuple[int, dict]:
    async with http.post(base + "/v1/chat/completions", json=body,
                         headers={"X-data-parallel-rank": str(rank)}) as resp:
        return resp.status, await resp.json()


async def test_a_lora_adapter_loaded_once_is_served_by_every_rank(ranks, tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 16, "lora_alpha": 16}))
    async with aiohttp.ClientSession() as http:
        async with http.post(ranks + "/v1/load_lora_adapter",
                             json={"lora_name": "tone", "lora_path": str(tmp_path)}) as resp:
            assert resp.status == 200, await resp.text()
        async with http.get(ranks + "/v1/models") as resp:
            assert "tone" in {m["id"] for m in (await resp.json())["data"]}
        for rank in (0, 1):
            status, body = await on_rank(http, ranks, rank, chat("tone"))
            assert status == 200 and body["model"] == "tone", body
        async with http.post(ranks + "/v1/unload_lora_adapter", json={"lora_name": "tone"}) as resp:
            assert resp.status == 200
        for rank in (0, 1):
            status, _ = await on_rank(http, ranks, rank, chat("tone"))
            assert status == 404


async def test_a_slowdown_of_one_rank_slows_that_rank_alone(ranks):
    async with aiohttp.ClientSession() as http:
        async with http.post(ranks + "/control/faults/replica",
                             json={"fault": "slow", "factor": 4, "seconds": 60, "replica": 1}) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["slow_factor"] == 4
        try:
            async with http.get(ranks + "/control/faults/replica", params={"replica": "0"}) as resp:
                assert (await resp.json())["slow_factor"] in (0, 1)
            e2e = {}
            for rank in (0, 1):
                status, body = await on_rank(http, ranks, rank, chat(max_tokens=32))
                assert status == 200
                e2e[rank] = body["inference_lab"]["e2e_s"]
            # the same request: every step of rank 1 takes four times as long
            assert e2e[1] == pytest.approx(4 * e2e[0], rel=0.05), e2e
        finally:
            async with http.post(ranks + "/control/faults/replica",
                                 json={"fault": "clear"}) as resp:
                assert resp.status == 200


async def test_sleep_puts_every_rank_to_sleep_and_wakes_every_one(ranks):
    async with aiohttp.ClientSession() as http:
        async with http.post(ranks + "/sleep", params={"level": "1"}, json={}) as resp:
            assert resp.status == 200
        try:
            async with http.get(ranks + "/is_sleeping") as resp:
                assert (await resp.json()) == {"is_sleeping": True}
            async with http.get(ranks + "/control/replicas") as resp:
                assert [r["replica"] for r in await resp.json()] == [0, 1]
            for rank in (0, 1):
                status, body = await on_rank(http, ranks, rank, chat())
                assert status == 503 and "sleeping" in body["error"]["message"], body
        finally:
            async with http.post(ranks + "/wake_up", json={}) as resp:
                assert resp.status == 200
        async with http.get(ranks + "/is_sleeping") as resp:
            assert (await resp.json()) == {"is_sleeping": False}
        for rank in (0, 1):
            status, _ = await on_rank(http, ranks, rank, chat())
            assert status == 200


async def paused_per_engine(served) -> list[bool]:
    """Each engine process's own word (GetCapacity over its gRPC port), in start order."""
    import grpc

    from inference_lab.v1 import engine_pb2 as pb
    from inference_lab.v1 import engine_pb2_grpc

    out = []
    for pid in served.engine_pids():
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode().split("\0")
        port = argv[argv.index("--port") + 1]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = await engine_pb2_grpc.EngineStub(channel).GetCapacity(
                pb.GetCapacityRequest(), timeout=5)
        out.append(all(row.paused for row in reply.models))
    return out


def test_dev_mode_pauses_and_resets_every_rank():
    # `/pause` and `/reset_prefix_cache` through the one port reach every rank's engine
    import asyncio

    with serve("--data-parallel-size", "2", "--dev-mode") as served:
        base = f"http://127.0.0.1:{served.port}"

        async def check() -> None:
            async with aiohttp.ClientSession() as http:
                async with http.post(base + "/pause", params={"mode": "keep"}, json={}) as resp:
                    assert resp.status == 200, await resp.text()
                async with http.get(base + "/is_paused") as resp:
                    assert (await resp.json()) == {"is_paused": True}
                assert await paused_per_engine(served) == [True, True]  # each rank's own
                async with http.post(base + "/resume", json={}) as resp:
                    assert resp.status == 200
                async with http.get(base + "/is_paused") as resp:
                    assert (await resp.json()) == {"is_paused": False}
                assert await paused_per_engine(served) == [False, False]
                for rank in (0, 1):  # a prompt cached on each rank, then every cache reset
                    status, _ = await on_rank(http, base, rank, chat())
                    assert status == 200
                async with http.post(base + "/reset_prefix_cache", json={}) as resp:
                    assert resp.status == 200, await resp.text()

        asyncio.run(check())
