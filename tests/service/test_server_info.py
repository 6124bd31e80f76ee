"""vLLM's dev-mode /server_info and the lab's /get_server_info with KV offloading,
in-process: the real gateway (real HTTP) in front of the real engine (real gRPC). The
engine tells the gateway its offload settings (ModelInfo.kv_offload); /server_info shows
the kv_transfer_config vLLM derives from them and cache_config's kv_offloading_size and
kv_offloading_backend; /get_server_info adds those two when offloading is on and answers
as before when it is off."""

from __future__ import annotations

import aiohttp
from aiohttp.test_utils import TestServer
from engine_helpers import running_engine

from inference_lab.engine.sim.config import default_deployments
from inference_lab.engine.sim.offload import from_flags
from inference_lab.gateway import create_app

GIB = 2**30


def deployments(size: float | None, backend: str | None = None):
    found = default_deployments("b200")
    for d in found:
        d.offload = from_flags(size, backend) if size is not None else None
    return found


async def get(size: float | None, path: str, backend: str | None = None, dev_mode: bool = True,
              **engine_options) -> tuple[int, dict]:
    async with running_engine(deployments=deployments(size, backend), **engine_options) as engine:
        app = create_app(f"127.0.0.1:{engine.port}", dev_mode=dev_mode)
        async with TestServer(app) as server, aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{server.port}{path}") as resp:
                return resp.status, await resp.json(content_type=None)


async def test_server_info_shows_the_offloading_connector_vllm_derives_from_the_size():
    status, body = await get(2, "/server_info?config_format=json")
    assert status == 200, body
    config = body["vllm_config"]
    assert config["kv_transfer_config"] == {
        "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 2 * GIB}}
    cache = config["cache_config"]
    assert (cache["kv_offloading_size"], cache["kv_offloading_backend"]) == (2.0, "native")
    assert cache["block_size"] > 0 and cache["num_gpu_blocks"] > 0
    assert config["model_config"]["model"] == "gpt-oss-20b"


async def test_the_lmcache_backend_names_its_connector_without_the_size():
    status, body = await get(4, "/server_info?config_format=json", backend="lmcache")
    config = body["vllm_config"]
    assert config["kv_transfer_config"] == {"kv_connector": "LMCacheMPConnector",
                                            "kv_role": "kv_both", "kv_connector_extra_config": {}}
    assert config["cache_config"]["kv_offloading_backend"] == "lmcache"


async def test_the_default_text_format_is_one_line_of_the_same_fields():
    status, body = await get(2, "/server_info")
    text = body["vllm_config"]
    assert status == 200 and isinstance(text, str) and "\n" not in text
    assert "kv_offloading_size=2.0" in text and "kv_offloading_backend='native'" in text
    assert '"kv_connector": "OffloadingConnector"' in text


async def test_offload_off_shows_vllms_defaults_and_no_connector():
    status, body = await get(None, "/server_info?config_format=json")
    config = body["vllm_config"]
    assert config["kv_transfer_config"] is None
    assert (config["cache_config"]["kv_offloading_size"],
            config["cache_config"]["kv_offloading_backend"]) == (None, "native")


async def test_a_p_d_role_with_offload_is_vllms_multi_connector_over_both():
    status, body = await get(1, "/server_info?config_format=json", kv_roles=("kv_both",))
    config = body["vllm_config"]["kv_transfer_config"]
    assert (config["kv_connector"], config["kv_role"]) == ("MultiConnector", "kv_both")
    connectors = config["kv_connector_extra_config"]["connectors"]
    assert [c["kv_connector"] for c in connectors] == ["NixlConnector", "OffloadingConnector"]
    assert connectors[0]["engine_id"] == config["engine_id"]


async def test_get_server_info_adds_the_offload_fields_only_when_offloading():
    _, on = await get(2, "/get_server_info")
    assert (on["kv_offloading_size"], on["kv_offloading_backend"]) == (2.0, "native")
    assert on["kv_transfer_config"] is None  # (the P/D connector's, as before: no role)
    _, off = await get(None, "/get_server_info")
    assert "kv_offloading_size" not in off and "kv_offloading_backend" not in off
    assert set(on) - set(off) == {"kv_offloading_size", "kv_offloading_backend"}


async def test_a_bad_config_format_is_a_400_naming_it():
    status, body = await get(None, "/server_info?config_format=yaml")
    assert (status, body["error"]["type"]) == (400, "invalid_request_error")
    assert body["error"]["message"].endswith("`?config_format`")


async def test_without_dev_mode_server_info_is_a_404():
    status, _ = await get(2, "/server_info", dev_mode=False)
    assert status == 404
