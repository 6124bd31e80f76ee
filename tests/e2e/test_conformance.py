"""`inference-lab conformance URL` as a user runs it: against the real `serve` (KV events,
sleep mode and a LoRA adapter on) every check passes and it exits 0; against a server that
has only /v1/models and a chat route each missing signal is named and it exits 1; an
unreachable URL is one line and exit status 2."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from aiohttp import web

from inference_lab.common.ports import free_port, free_port_run
from inference_lab.testing.launch import serve


def conformance(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "inference_lab", "--log-level", "WARNING",
                           "conformance", *args], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    kv = free_port_run(2)
    config = json.dumps({"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{kv}",
                         "replay_endpoint": f"tcp://127.0.0.1:{kv + 1}"})
    adapter = tmp_path_factory.mktemp("adapters") / "sql"  # never read: the rank defaults
    with serve("--kv-events-config", config, "--enable-sleep-mode",
               "--lora-modules", f"sql-lora={adapter}") as served:
        yield served.base


@contextlib.contextmanager
def bare_server():
    """A server with /v1/models and a non-streaming chat route, nothing else."""

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "bare", "object": "model"}]})

    async def chat(request):
        return web.json_response({
            "id": "chatcmpl-1", "object": "chat.completion", "model": "bare",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    port = free_port()
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_the_lab_passes_every_check_and_exits_0(lab):
    out = conformance(lab, "--json", "--timeout", "10")
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert (report["model"], report["ok"], report["failed"]) == ("gpt-oss-20b", True, [])
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert status.pop("offload tier") == "SKIP"
    assert set(status.values()) == {"PASS"}, report["checks"]
    reasons = {c["name"]: c["reason"] for c in report["checks"]}
    assert "kv_block_size 64" in reasons["/get_server_info"]
    assert "BlockStored" in reasons["KV events over ZMQ"]
    assert "1 adapter served" in reasons["metrics: LoRA"]
    assert reasons["offload tier"].startswith("offload off: vllm:cache_config_info has ")

    plain = conformance(lab)  # not a terminal: one line per check
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert plain.stdout.splitlines()[-1] == "every required check passed"
    assert any(line.startswith("SKIP  offload tier") for line in plain.stdout.splitlines())


def test_a_server_lacking_the_signals_has_each_one_named_and_exits_1():
    with bare_server() as url:
        out = conformance(url, "--json", "--timeout", "5")
        plain = conformance(url, "--timeout", "5")
    assert out.returncode == 1, out.stdout + out.stderr
    report = json.loads(out.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["model"] == "bare" and not report["ok"]
    assert report["failed"] == ["metrics: queue gauges", "metrics: KV-cache usage", "metrics: cache config",
                                "chat completion, streamed", "load: /load or /get_load",
                                "/get_server_info", "render API"]
    for name in ("/v1/models", "chat completion", "X-data-parallel-rank"):
        assert checks[name]["status"] == "PASS", checks[name]
    assert checks["metrics: queue gauges"]["reason"] == "/metrics: HTTP 404"
    assert "not text/event-stream" in checks["chat completion, streamed"]["reason"]
    assert checks["load: /load or /get_load"]["reason"] == "neither load route: /load (HTTP 404), /get_load (HTTP 404)"
    assert checks["/get_server_info"]["reason"] == "/get_server_info: HTTP 404"
    assert checks["render API"]["reason"] == "/v1/chat/completions/render: HTTP 404"
    # the optional signals: named, reported, and not counted against the server
    assert (checks["/kv_event_sources"]["status"], checks["/kv_event_sources"]["required"]) == ("FAIL", False)
    assert checks["/kv_event_sources"]["reason"] == "/kv_event_sources: HTTP 404"
    assert checks["KV events over ZMQ"]["status"] == checks["metrics: LoRA"]["status"] == "SKIP"
    assert checks["sleep mode: /is_sleeping"]["reason"].startswith("/is_sleeping: HTTP 404")
    assert plain.returncode == 1
    assert plain.stdout.splitlines()[-1].startswith("7 required checks failed: metrics: queue gauges, ")


def test_an_unreachable_url_is_one_line_and_exit_2():
    out = conformance(f"http://127.0.0.1:{free_port()}")
    assert out.returncode == 2
    assert out.stdout == "" and len(out.stderr.splitlines()) == 1, out.stderr
    assert "no answer from http://127.0.0.1:" in out.stderr and "Connection refused" in out.stderr
    bad = conformance("localhost:8000")
    assert bad.returncode == 2 and "expected an http:// or https:// URL" in bad.stderr
    assert "Traceback" not in out.stderr + bad.stderr


def test_data_parallel_ranks_behind_one_port_pass_too():
    # two ranks in processes of their own, two API servers: the KV-event check watches
    # rank 1's publisher (the last source listed) and so sends its request to rank 1
    kv = free_port_run(4)
    config = json.dumps({"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{kv}",
                         "replay_endpoint": f"tcp://127.0.0.1:{kv + 1}"})
    with serve("--kv-events-config", config, "--data-parallel-size", "2",
               "--api-server-count", "2") as served:
        out = conformance(served.base, "--json", "--timeout", "10")
    assert out.returncode == 0, out.stdout + out.stderr
    reasons = {c["name"]: (c["status"], c["reason"]) for c in json.loads(out.stdout)["checks"]}
    assert reasons["/kv_event_sources"] == ("PASS", "ranks 0, 1")
    status, reason = reasons["KV events over ZMQ"]
    assert status == "PASS" and "BlockStored" in reason, reason


def test_the_offload_tier_passes_on_a_server_with_kv_offloading():
    # 4 GiB over gpt-oss-20b's 64-token blocks of 1,572,864 B (rounded to whole pages):
    # 4 x 2^30 // 1,572,864 = 2,730 chunks
    config = Path(__file__).resolve().parents[2] / "configs" / "gpt-oss-20b.toml"
    with serve("--config", str(config), "--kv-offloading-size", "4") as served:
        out = conformance(served.base, "--json", "--timeout", "10")
    assert out.returncode == 0, out.stdout + out.stderr
    checks = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    offload = checks["offload tier"]
    assert (offload["status"], offload["required"]) == ("PASS", False), offload
    assert offload["reason"].startswith("kv_offloading_size=4.0; backend native; 2730 host chunks; "
                                        "4 vllm:kv_offload_* counters ("), offload["reason"]
