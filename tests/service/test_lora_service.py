"""LoRA adapters through the real gateway and engine: listed with their base model,
requested by name in `model` (the official `openai` SDK), loaded and unloaded at run time
as vLLM does it, and an unknown adapter is a 404 like an unknown model."""

from __future__ import annotations

import json
import time

import openai
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from engine_helpers import running_engine
from factories import core

from inference_lab.engine.metrics.exposition import MetricsRegistry
from inference_lab.engine.service.lora_modules import LoraModule, parse_lora_module, read_rank
from inference_lab.engine.sim.lora import LoraError
from inference_lab.gateway import create_app


async def test_adapters_are_listed_served_loaded_and_unloaded(tmp_path):
    adapter = tmp_path / "sql-lora"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 32, "lora_alpha": 16}))
    async with running_engine(lora_modules=[LoraModule("sql-lora", str(adapter), "")],
                              max_loras=2) as engine:
        async with TestServer(create_app(f"127.0.0.1:{engine.port}")) as server:
            base = f"http://127.0.0.1:{server.port}"
            client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
            models = {m.id: m for m in (await client.models.list()).data}
            assert models["sql-lora"].model_extra["parent"] == "gpt-oss-20b"
            assert models["gpt-oss-20b"].model_extra["parent"] is None
            reply = await client.chat.completions.create(
                model="sql-lora", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
            assert reply.usage.completion_tokens == 4 and reply.model == "sql-lora"
            with pytest.raises(openai.NotFoundError):
                await client.chat.completions.create(
                    model="no-such-lora", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
            async with ClientSession() as http:
                async def post(path, body):
                    async with http.post(base + path, json=body) as resp:
                        return resp.status, await resp.text()

                status, text = await post("/v1/load_lora_adapter",
                                          {"lora_name": "chat-lora", "lora_path": "/nowhere"})
                assert (status, text) == (200, "Success: LoRA adapter 'chat-lora' added successfully.")
                reply = await client.completions.create(model="chat-lora", prompt="x", max_tokens=2)
                assert reply.usage.completion_tokens == 2
                status, text = await post("/v1/load_lora_adapter",
                                          {"lora_name": "chat-lora", "lora_path": "/nowhere"})
                assert status == 400 and "already been loaded" in json.loads(text)["error"]["message"]
                status, text = await post("/v1/load_lora_adapter", {"lora_name": "x"})
                assert status == 400 and "lora_path" in json.loads(text)["error"]["message"]
                status, _ = await post("/v1/unload_lora_adapter", {"lora_name": "chat-lora"})
                assert status == 200
                status, text = await post("/v1/unload_lora_adapter", {"lora_name": "chat-lora"})
                assert status == 404 and "cannot be found" in json.loads(text)["error"]["message"]
            with pytest.raises(openai.NotFoundError):
                await client.completions.create(model="chat-lora", prompt="x", max_tokens=2)
            await client.close()
        ranks = {a.name: a.rank for a in engine.runtimes[0].core.loras.adapters.values()}
        assert ranks == {"sql-lora": 32}


def test_lora_module_forms_and_malformed_ones():
    assert parse_lora_module("a=/p") == LoraModule("a", "/p", "")
    assert parse_lora_module('{"name": "a", "path": "/p", "base_model_name": "m"}') == \
        LoraModule("a", "/p", "m")
    for bad in ("a", "=/p", "a=", '{"name": "a"}', '{"name": "a", "path": "/p", "x": 1}', "{"):
        with pytest.raises(LoraError):
            parse_lora_module(bad)


def test_the_rank_comes_from_adapter_config_json(tmp_path):
    assert read_rank(str(tmp_path)) == 16  # none there
    (tmp_path / "adapter_config.json").write_text('{"r": 8}')
    assert read_rank(str(tmp_path)) == 8
    (tmp_path / "adapter_config.json").write_text('{"r": "eight"}')
    with pytest.raises(LoraError, match="`r` must be an integer"):
        read_rank(str(tmp_path))


@pytest.mark.parametrize("content", ['{"r": "SECRET-VALUE"}', '"SECRET-VALUE"',
                                     'SECRET-VALUE', b'\xffSECRET-VALUE'])
def test_a_bad_adapter_config_is_refused_naming_the_field_never_quoting_the_file(tmp_path, content):
    config = tmp_path / "adapter_config.json"
    config.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(LoraError) as err:
        read_rank(str(tmp_path))
    assert "SECRET" not in str(err.value) and "\\x" not in str(err.value)
    assert str(config) in str(err.value)


def test_an_adapter_config_larger_than_the_bound_is_refused_without_reading_it(tmp_path):
    from inference_lab.engine.service.lora_modules import MAX_CONFIG_BYTES

    config = tmp_path / "adapter_config.json"
    with open(config, "wb") as f:  # 300 MB, sparse: what a read of it would allocate
        f.truncate(300 * 1024 * 1024)
    start = time.perf_counter()
    with pytest.raises(LoraError, match=f"larger than {MAX_CONFIG_BYTES} bytes"):
        read_rank(str(tmp_path))
    assert time.perf_counter() - start < 0.05  # not read: its size is enough
    config.write_text(json.dumps({"r": 8, "pad": " " * (MAX_CONFIG_BYTES - 100)}))
    assert read_rank(str(tmp_path)) == 8  # up to the bound, read as before


async def test_the_load_route_answers_a_bad_config_with_a_400_that_quotes_nothing(tmp_path):
    (tmp_path / "adapter_config.json").write_text('{"r": "SECRET-VALUE"}')
    async with running_engine(max_loras=2) as engine:
        async with TestServer(create_app(f"127.0.0.1:{engine.port}")) as server, \
                ClientSession() as http:
            resp = await http.post(f"http://127.0.0.1:{server.port}/v1/load_lora_adapter",
                                   json={"lora_name": "x", "lora_path": str(tmp_path)})
            text = await resp.text()
            assert resp.status == 400, text
            assert "SECRET" not in text and "`r` must be an integer" in text


def test_lora_requests_info_reports_running_and_waiting_adapters_as_vllm_does():
    engine = core()
    loras = engine.enable_lora(max_loras=1)
    a, b = loras.load("sql", "/a"), loras.load("chat", "/b")
    engine.submit(100, 50, 0.0, lora=a)
    engine.submit(100, 50, 0.0, lora=b)
    engine.step(0.0)
    before = time.time()
    text = MetricsRegistry([engine]).render().decode()
    (line,) = [x for x in text.splitlines() if x.startswith("vllm:lora_requests_info{")]
    labels, value = line.rsplit(" ", 1)
    assert 'max_lora="1"' in labels and 'model_name="gpt-oss-20b"' in labels
    assert 'running_lora_adapters="sql"' in labels and 'waiting_lora_adapters="chat"' in labels
    assert float(value) >= before - 1  # vLLM sets it to the current time
