"""Sleep mode through the real `serve --enable-sleep-mode` with two replicas: POST /sleep
and /wake_up (control routes: the control token), GET /is_sleeping, per replica on its
own port (`--replicas`) or for every model on a plain `serve`; a sleeping replica refuses with a 503 and aborts
what was in flight, /health says so, and the wake's modelled reload of the weights shows
in the first request's TTFT and in the gauges."""

from __future__ import annotations

import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
from hardening_helpers import json_request

from inference_lab.testing.launch import serve

ROOT = Path(__file__).resolve().parents[2]
MODEL = "gpt-oss-20b"
TOKEN = "sleep-token"
# gpt-oss-20b's resident weights over a B200's host link (64 GB/s), tp 1
WAKE_S = 13_150_126_080 / 64e9


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    configs = tmp_path_factory.mktemp("configs")
    shutil.copy(ROOT / "configs" / f"{MODEL}.toml", configs / f"{MODEL}.toml")
    with serve("--config", str(configs), "--enable-sleep-mode", "--replicas", "2",
               "--control-token", TOKEN, ports=2) as served:
        yield served


def call(port: int, method: str, path: str, body: dict | None = None,
         token: str | None = TOKEN) -> tuple[int, dict | None]:
    return json_request(f"http://127.0.0.1:{port}", method, path, body, token=token)


def chat(port: int, max_tokens: int = 4) -> tuple[int, dict]:
    return call(port, "POST", "/v1/chat/completions",
                {"model": MODEL, "max_tokens": max_tokens,
                 "messages": [{"role": "user", "content": "hi"}]}, token=None)


def gauge(port: int, series: str, **labels: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    want = [f'{k}="{v}"' for k, v in labels.items()]
    for line in text.splitlines():
        if line.startswith(series + "{") and all(w in line for w in want):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {series} {labels}")


def test_sleep_and_wake_are_control_routes(lab):
    assert call(lab.port, "POST", "/sleep?level=1", token=None)[0] == 401
    assert call(lab.port, "POST", "/wake_up", token="wrong")[0] == 401
    status, body = call(lab.port, "POST", "/sleep?level=3")
    assert status == 400 and "level must be 1 or 2" in body["error"]["message"]
    status, body = call(lab.port, "POST", "/wake_up?tags=gpu")
    assert status == 400 and "unknown tag 'gpu'" in body["error"]["message"]
    assert call(lab.port, "GET", "/is_sleeping", token=None) == (200, {"is_sleeping": False})


def test_a_sleeping_replica_refuses_aborts_its_streams_and_says_so(lab):
    replica = lab.port + 1
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{replica}/v1", api_key="x", max_retries=0)
    stream = client.chat.completions.create(model=MODEL, max_tokens=5000, stream=True,
                                            messages=[{"role": "user", "content": "hi"}])
    first = next(iter(stream))  # in flight when the sleep comes
    assert first.choices[0].delta.role == "assistant"
    assert call(replica, "POST", "/sleep?level=1") == (200, None)
    with pytest.raises(openai.APIError):  # the stream ends in its error event
        for _ in stream:
            pass
    assert call(replica, "GET", "/is_sleeping") == (200, {"is_sleeping": True})
    assert call(lab.port, "GET", "/is_sleeping") == (200, {"is_sleeping": False})  # replica 0
    status, body = chat(replica)
    assert status == 503 and body["error"]["code"] == "engine_sleeping"
    assert "sleeping (level 1)" in body["error"]["message"]
    assert chat(lab.port)[0] == 200  # replica 0 is awake and serves
    status, health = call(replica, "GET", "/health", token=None)
    assert status == 200 and health == {"status": "sleeping", "sleeping": [
        {"model": MODEL, "replica": 1, "level": 1}]}
    assert call(replica, "GET", "/health/ready", token=None)[0] == 503
    assert gauge(replica, "vllm:engine_sleep_state", sleep_state="weights_offloaded", engine="1") == 1
    assert gauge(replica, "vllm:engine_sleep_state", sleep_state="awake", engine="1") == 0

    # a partial wake (the KV cache only) leaves it asleep; the weights' reload wakes it
    assert call(replica, "POST", "/wake_up?tags=kv_cache") == (200, None)
    assert call(replica, "GET", "/is_sleeping")[1] == {"is_sleeping": True}
    assert call(replica, "POST", "/wake_up?tags=weights") == (200, None)
    woke = time.monotonic()
    status, body = chat(replica)
    assert status == 200
    # the first request waits for what is left of the modelled reload of the weights
    assert body["inference_lab"]["ttft_s"] >= WAKE_S - (time.monotonic() - woke) - 0.01
    assert gauge(replica, "inference_lab_wake_seconds", engine="1") == pytest.approx(WAKE_S)
    assert gauge(replica, "vllm:engine_sleep_state", sleep_state="awake", engine="1") == 1
    assert call(replica, "GET", "/health", token=None)[1] == {"status": "ok"}
    assert call(replica, "GET", "/health/ready", token=None)[0] == 200
    assert chat(replica)[1]["inference_lab"]["ttft_s"] < WAKE_S / 10  # once past it


def test_level_two_without_replicas_sleeps_every_model(tmp_path):
    for name in (MODEL, "bge-base-en-v1.5"):
        shutil.copy(ROOT / "configs" / f"{name}.toml", tmp_path / f"{name}.toml")
    with serve("--config", str(tmp_path), "--enable-sleep-mode") as served:
        assert call(served.port, "POST", "/sleep?level=2", token=None) == (200, None)
        assert chat(served.port)[0] == 503
        status, body = call(served.port, "POST", "/v1/embeddings",
                            {"model": "bge-base-en-v1.5", "input": "x"}, token=None)
        assert status == 503 and body["error"]["code"] == "engine_sleeping"
        assert gauge(served.port, "vllm:engine_sleep_state", sleep_state="discard_all",
                     model_name=MODEL) == 1
        assert call(served.port, "POST", "/wake_up", token=None) == (200, None)
        assert call(served.port, "GET", "/is_sleeping")[1] == {"is_sleeping": False}
        assert chat(served.port)[0] == 200


def test_without_the_flag_sleep_is_a_400(tmp_path):
    shutil.copy(ROOT / "configs" / f"{MODEL}.toml", tmp_path / f"{MODEL}.toml")
    with serve("--config", str(tmp_path)) as served:
        status, body = call(served.port, "POST", "/sleep", token=None)
        assert status == 400 and "--enable-sleep-mode" in body["error"]["message"]
        # as vLLM's are sent (`curl -X POST .../sleep?level=1`): no body, no Content-Type
        bare = urllib.request.Request(f"http://127.0.0.1:{served.port}/sleep?level=1",
                                      method="POST")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(bare, timeout=10)
        assert err.value.code == 400 and "--enable-sleep-mode" in err.value.read().decode()
        assert call(served.port, "GET", "/is_sleeping") == (200, {"is_sleeping": False})
