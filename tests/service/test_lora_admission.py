"""LoRA load and unload are control calls, and an adapter is registered only once every
replica of its base admitted it: a refused load (beyond the 64-adapter limit, an empty or
unprintable name) leaves no trace in the model list, so replicas added later load every
listed adapter and `POST /control/replicas` answers 200, never a 500 with an internal
exception's text. The real engine and the real fleet gateway, over real gRPC and HTTP."""

from __future__ import annotations

import aiohttp
from engine_helpers import running_engine

from inference_lab.engine.sim.lora import MAX_ADAPTERS
from inference_lab.gateway.fleet import FleetGateway

KEY, TOKEN = "sk-lab-lora", "ct-lab-lora"
API = {"Authorization": f"Bearer {KEY}"}
CONTROL = {"Authorization": f"Bearer {TOKEN}"}


async def test_refused_loads_are_not_registered_and_new_replicas_take_every_listed_one():
    async with running_engine(max_loras=1) as engine:
        fleet = FleetGateway(f"127.0.0.1:{engine.port}", port=0)
        base = f"http://127.0.0.1:{await fleet.start()}"
        try:
            async with aiohttp.ClientSession() as http:
                async def load(name: str) -> tuple[int, dict | str]:
                    async with http.post(base + "/v1/load_lora_adapter",
                                         json={"lora_name": name, "lora_path": "/a"}) as resp:
                        return resp.status, await resp.text()

                for i in range(MAX_ADAPTERS):
                    assert (await load(f"a{i}"))[0] == 200
                for name in ("one-too-many", "", "tab\tname", "x" * 300):
                    status, text = await load(name)
                    assert status == 400, (name, text)
                async with http.get(base + "/v1/models") as resp:
                    listed = {m["id"] for m in (await resp.json())["data"]}
                assert listed == {"gpt-oss-20b", *(f"a{i}" for i in range(MAX_ADAPTERS))}
                async with http.post(base + "/control/replicas", json={"replicas": 2}) as resp:
                    assert resp.status == 200, await resp.text()
                rt = engine.fleet.replicas["gpt-oss-20b"][1].runtime
                assert set(rt.adapters) == listed - {"gpt-oss-20b"}
        finally:
            await fleet.stop()


async def test_load_and_unload_need_the_control_token_not_the_api_key():
    async with running_engine(max_loras=1, api_key=KEY, control_token=TOKEN) as engine:
        fleet = FleetGateway(f"127.0.0.1:{engine.port}", port=0, api_key=KEY,
                             control_token=TOKEN)
        base = f"http://127.0.0.1:{await fleet.start()}"
        body = {"lora_name": "chat", "lora_path": "/a"}
        try:
            async with aiohttp.ClientSession() as http:
                for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
                    async with http.post(base + path, json={"lora_name": "chat"},
                                         headers=API) as resp:
                        assert resp.status == 401
                        assert (await resp.json())["error"]["code"] == "invalid_control_token"
                assert "chat" not in engine.service.adapters
                async with http.post(base + "/v1/load_lora_adapter", json=body,
                                     headers=CONTROL) as resp:
                    assert resp.status == 200
                async with http.post(base + "/v1/unload_lora_adapter", json={"lora_name": "chat"},
                                     headers=CONTROL) as resp:
                    assert resp.status == 200
                assert "chat" not in engine.service.adapters
        finally:
            await fleet.stop()
