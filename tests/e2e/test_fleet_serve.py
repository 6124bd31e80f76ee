"""`inference-lab serve --replicas 3`, for real: replica i on port + i with the full API
(official openai SDK), readiness after the start-up delay, x-request-id echoed, each
replica's /metrics (passing promtool) with its own vllm:* series, and live scaling through
POST /control/replicas: a new port opens at once and is ready after the delay; a drained
replica finishes its stream and its port closes; bad input is refused; a model scaled to 0
answers 503 until a replica is back."""

from __future__ import annotations

import http.client
import json
import re
import shutil
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from metrics_helpers import promtool_check, sample
from inference_lab.testing.launch import serve
from inference_lab.testing.poll import wait_until

ROOT = Path(__file__).resolve().parents[2]
DELAY = 1.0
pytestmark = pytest.mark.timeout(120)


def call(port: int, method: str, path: str, body: dict | None = None,
         headers: dict | None = None) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"content-type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def ready(port: int) -> bool:
    try:
        return call(port, "GET", "/health/ready")[0] == 200
    except OSError:
        return False


def closed(port: int) -> bool:
    try:
        call(port, "GET", "/health")
    except OSError:
        return True
    return False


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    configs = tmp_path_factory.mktemp("configs")
    for name in ("gpt-oss-20b.toml", "llama-3.1-8b.toml"):
        shutil.copy(ROOT / "configs" / name, configs / name)
    with serve("--config", str(configs), "--replicas", "3", "--startup-delay", str(DELAY),
               ports=5) as served:
        wait_until(lambda: all(ready(served.port + i) for i in range(3)))
        yield served


def test_every_replica_port_serves_the_openai_api_and_echoes_the_request_id(fleet):
    for i in range(3):
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{fleet.port + i}/v1", api_key="x",
                               max_retries=0)
        done = client.chat.completions.create(
            model="gpt-oss-20b", messages=[{"role": "user", "content": "hi"}], max_tokens=9)
        assert done.usage.completion_tokens == 9
        assert {m.id for m in client.models.list().data} == {"gpt-oss-20b", "llama-3.1-8b"}
        status, headers, _ = call(fleet.port + i, "GET", "/v1/models",
                                  headers={"x-request-id": f"req-{i}"})
        assert status == 200 and headers["x-request-id"] == f"req-{i}"
    rows = json.loads(call(fleet.port, "GET", "/control/replicas")[2])
    assert {(r["model"], r["replica"], r["port"], r["ready"]) for r in rows} == {
        (m, i, fleet.port + i, True) for m in ("gpt-oss-20b", "llama-3.1-8b") for i in range(3)}


def histograms(text: str) -> dict[tuple, tuple[list[float], float]]:
    """(name, labels without le) -> (bucket values in order, _count) of an exposition."""
    found: dict[tuple, tuple[list[float], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (family.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")))
            buckets, count = found.get(key, ([], 0.0))
            if s.name.endswith("_bucket"):
                buckets.append(s.value)
            elif s.name.endswith("_count"):
                count = s.value
            found[key] = (buckets, count)
    return {k: v for k, v in found.items() if v[0]}


@pytest.mark.tools("promtool")
def test_each_replica_metrics_carry_only_its_own_series_and_pass_promtool(fleet):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{fleet.port + 1}/v1", api_key="x",
                           max_retries=0)
    key = ("vllm:e2e_request_latency_seconds", (("engine", "1"), ("model_name", "gpt-oss-20b")))
    before = call(fleet.port + 1, "GET", "/metrics")[2].decode()
    finished = histograms(before).get(key, ([], 0.0))[1]
    generated = sample(before, "vllm:generation_tokens_total", engine="1",
                       model_name="gpt-oss-20b")
    for tokens in (5, 17):  # every histogram of replica 1 gets observations
        client.completions.create(model="gpt-oss-20b", prompt="a b c", max_tokens=tokens)
    status, _, body = call(fleet.port + 1, "GET", "/metrics")
    text = body.decode()
    assert status == 200
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running",
                 "vllm:kv_cache_usage_perc"):
        assert f'{name}{{engine="1",model_name="gpt-oss-20b"}}' in text
    info = [line for line in text.splitlines() if line.startswith("vllm:cache_config_info{")]
    assert len(info) == 2 and all('block_size="64"' in line and 'engine="1"' in line
                                  and "num_gpu_blocks=" in line for line in info)
    assert 'engine="0"' not in text and 'engine="2"' not in text
    assert "inference_lab_gateway_http_requests_total" in text  # the gateway's own too
    assert promtool_check(text)[1] == []  # parses; only vLLM's own names are linted
    # the filled-in numbers: cumulative buckets ending at _count, two finished requests
    hists = histograms(text)
    assert all(b == sorted(b) and b[-1] == count for b, count in hists.values())
    assert hists[key][1] == finished + 2
    assert sample(text, "vllm:generation_tokens_total", engine="1",
                  model_name="gpt-oss-20b") == generated + 22
    # the base port is replica 0's, with the same families: nothing is left out for speed
    base = call(fleet.port, "GET", "/metrics")[2].decode()
    assert set(re.findall(r'engine="\d+"', base)) == {'engine="0"'}
    families = {f.name for f in text_string_to_metric_families(text)}
    assert {f.name for f in text_string_to_metric_families(base)} == families
    assert len(families) > 40
    assert promtool_check(base)[1] == []


def test_a_model_without_this_replica_is_a_404_and_bad_scaling_input_a_400(fleet):
    status, _, body = call(fleet.port, "POST", "/control/replicas",
                           {"model": "llama-3.1-8b", "replicas": 2})
    assert status == 200
    assert sorted(r["replica"] for r in json.loads(body) if not r["draining"]) == [0, 1]
    wait_until(lambda: all(r["model"] != "llama-3.1-8b" or r["replica"] < 2
                           for r in json.loads(call(fleet.port, "GET", "/control/replicas")[2])))
    status, _, body = call(fleet.port + 2, "POST", "/v1/chat/completions",
                           {"model": "llama-3.1-8b", "max_tokens": 3,
                            "messages": [{"role": "user", "content": "hi"}]})
    assert status == 404 and json.loads(body)["error"]["code"] == "replica_not_found"
    for bad, field in (({"replicas": -1}, "replicas"), ({"replicas": 65}, "64"),
                       ({"replicas": "2"}, "replicas"), ({"replica": 2}, "replica")):
        status, _, body = call(fleet.port, "POST", "/control/replicas", bad)
        assert status == 400 and field in json.loads(body)["error"]["message"], body
    status, _, body = call(fleet.port, "POST", "/control/replicas", {"model": "nope", "replicas": 1})
    assert status == 404
    assert call(fleet.port, "POST", "/control/replicas",
                {"model": "llama-3.1-8b", "replicas": 3})[0] == 200


def test_a_new_replica_opens_at_once_and_a_drained_one_finishes_then_closes(fleet):
    new = fleet.port + 3
    status, _, body = call(fleet.port, "POST", "/control/replicas", {"replicas": 4})
    assert status == 200
    assert {r["replica"]: r["port"] for r in json.loads(body)}[3] == new
    status, _, body = call(new, "GET", "/health/ready")  # the port is open, not ready
    assert status == 503 and json.loads(body)["error"]["code"] == "replica_unavailable"
    assert call(new, "GET", "/health")[0] == 200
    assert call(new, "GET", "/v1/models")[0] == 503
    wait_until(lambda: ready(new))
    # a stream in flight on replica 3 when it is drained runs to its end
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{new}/v1", api_key="x", max_retries=0)
    stream = client.chat.completions.create(
        model="gpt-oss-20b", messages=[{"role": "user", "content": "hi"}], max_tokens=600,
        stream=True, stream_options={"include_usage": True})
    chunks = iter(stream)
    first = next(chunks)
    assert first.choices[0].delta.role == "assistant"
    status, _, body = call(fleet.port, "POST", "/control/replicas", {"replicas": 3})
    assert status == 200
    assert [r["draining"] for r in json.loads(body) if r["model"] == "gpt-oss-20b"] == [
        False, False, False, True]
    status, _, body = call(new, "POST", "/v1/completions",
                           {"model": "gpt-oss-20b", "prompt": "x", "max_tokens": 2})
    assert status == 503 and b"draining" in body
    usage = [c.usage for c in chunks if c.usage is not None]
    assert usage and usage[-1].completion_tokens == 600
    wait_until(lambda: closed(new))
    assert ready(fleet.port + 2)


def test_draining_every_replica_answers_503_until_one_is_ready_again(fleet):
    request = {"model": "gpt-oss-20b", "prompt": "x", "max_tokens": 2}
    assert call(fleet.port, "POST", "/control/replicas",
                {"model": "gpt-oss-20b", "replicas": 0})[0] == 200
    wait_until(lambda: all(r["model"] != "gpt-oss-20b" for r in
                           json.loads(call(fleet.port, "GET", "/control/replicas")[2])))
    assert not closed(fleet.port + 2)  # llama-3.1-8b still has replica 2
    status, _, body = call(fleet.port, "POST", "/v1/completions", request)
    assert status == 503 and json.loads(body)["error"]["code"] == "replica_unavailable"
    assert call(fleet.port, "POST", "/control/replicas",
                {"model": "gpt-oss-20b", "replicas": 1})[0] == 200
    wait_until(lambda: call(fleet.port, "POST", "/v1/completions", request)[0] == 200)


def test_fleet_targets_list_every_replica_port_for_prometheus_discovery(fleet):
    status, _, body = call(fleet.port, "GET", "/fleet/targets")
    groups = json.loads(body)
    assert status == 200
    ports = {int(g["targets"][0].rsplit(":", 1)[1]): g["labels"]["replica"] for g in groups}
    assert all(g["targets"][0].startswith("127.0.0.1:") for g in groups)
    assert {fleet.port + i: str(i) for i in range(3)}.items() <= ports.items()
