"""Injected errors, scripts, seeds and retry hints through the real gateway over HTTP (a
fake engine on a free port); the `[fault]` TOML table."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from inference_lab.common.toml import ConfigError
from inference_lab.gateway import create_app
from inference_lab.gateway.faults.config import load_fault_tables
from inference_lab.gateway.faults.control import MAX_SCRIPT_STEPS
from inference_lab.gateway.faults.saving import DEBOUNCE_S
from inference_lab.gateway.faults.injection import FaultState
from inference_lab.testing.fake_engine import FAKE_MODEL, FakeEngine

CHAT = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
STATUS = {"rate_limit": 429, "invalid_api_key": 401, "context_length": 400, "server_error": 500,
          "overloaded": 503, "model_not_found": 404, "queue_saturated": 529}


async def post_faults(client, **body) -> dict:
    resp = await client.post("/control/faults", json=body)
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def statuses(client, n: int, body: dict = CHAT) -> list[int]:
    out = []
    for _ in range(n):
        resp = await client.post("/v1/chat/completions", json=body)
        await resp.read()
        out.append(resp.status)
    return out


async def test_nothing_is_injected_by_default(client):
    state = await (await client.get("/control/faults")).json()
    assert state["defaults"]["rate"] == 0 and state["scripts"] == {}
    assert await statuses(client, 5) == [200] * 5


async def test_a_script_fails_the_first_three_with_429_then_succeeds(client, fake):
    await post_faults(client, script=[{"error": "rate_limit", "count": 3}])
    assert await statuses(client, 5) == [429, 429, 429, 200, 200]
    assert len(fake.opened.items) == 2  # the refused ones never reached the engine
    state = await (await client.get("/control/faults")).json()
    assert state["injected"] == {"rate_limit": 3} and state["scripts"] == {}


async def test_every_type_has_its_status_and_envelope(client):
    steps = [{"error": t, "count": 1} for t in STATUS] + [{"error": "ok"}]
    await post_faults(client, script=steps)
    for name, status in STATUS.items():
        resp = await client.post("/v1/chat/completions", json=CHAT)
        assert resp.status == status and resp.content_type == "application/json"
        err = (await resp.json())["error"]
        assert {"message", "type", "code"} <= set(err) and "injected" in err["message"]
    assert await statuses(client, 1) == [200]


async def test_the_observed_rate_is_within_a_binomial_bound(client):
    n, p = 400, 0.25
    await post_faults(client, rate=p, types=["overloaded", "server_error"], seed=7)
    got = await statuses(client, n)
    failed = sum(s != 200 for s in got)
    sd = math.sqrt(n * p * (1 - p))  # 8.66: the bound below is +-4.5 sd (p ~ 7e-6 to miss)
    assert abs(failed - n * p) <= 4.5 * sd, failed
    assert set(got) <= {200, 503, 500} and {503, 500} <= set(got)


async def test_the_same_seed_replays_the_same_run(client):
    await post_faults(client, rate=0.5, seed=123)
    first = await statuses(client, 40)
    await post_faults(client, seed=123)
    assert await statuses(client, 40) == first
    await post_faults(client, seed=124)
    assert await statuses(client, 40) != first


async def test_model_settings_override_the_defaults_and_scripts_are_per_model():
    engine = FakeEngine({FAKE_MODEL: 4096, "other": 4096})
    await engine.start()
    try:
        async with TestClient(TestServer(create_app(engine.target))) as c:
            await post_faults(c, rate=1.0, types=["rate_limit"])
            await post_faults(c, model=FAKE_MODEL, rate=0.0)
            assert await statuses(c, 3) == [200] * 3
            assert await statuses(c, 2, {**CHAT, "model": "other"}) == [429, 429]
            await post_faults(c, model=FAKE_MODEL, script=[{"error": "server_error"}])
            assert await statuses(c, 2) == [500, 200]
            state = await (await c.get("/control/faults")).json()
            assert state["models"][FAKE_MODEL]["rate"] == 0 and state["defaults"]["rate"] == 1
    finally:
        await engine.stop()


async def test_retry_hints_go_on_real_529s_and_503s_too(fake):
    async with TestClient(TestServer(create_app(fake.target))) as c:
        await post_faults(c, retry_after=2, retry_after_ms=1500, should_retry=True)
        fake.mode = "reject"  # the engine's own QUEUE_SATURATED
        resp = await c.post("/v1/chat/completions", json=CHAT)
        assert resp.status == 529
        assert (resp.headers["retry-after"], resp.headers["retry-after-ms"],
                resp.headers["x-should-retry"]) == ("2", "1500", "true")
        await fake.stop()  # engine unreachable: 503
        resp = await c.post("/v1/chat/completions", json=CHAT)
        assert resp.status == 503 and resp.headers["retry-after-ms"] == "1500"
        resp = await c.post("/v1/chat/completions", json={**CHAT, "model": 7})  # 400: no hints
        assert resp.status in (400, 503) and "retry-after" not in resp.headers


async def test_retry_hints_are_off_by_default_and_can_be_cleared(client, fake):
    fake.mode = "reject"
    resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status == 529 and "retry-after" not in resp.headers
    await post_faults(client, retry_after=1)
    await post_faults(client, retry_after=None)
    resp = await client.post("/v1/chat/completions", json=CHAT)
    assert "retry-after" not in resp.headers


@pytest.mark.parametrize("body, named", [
    ({}, "Nothing to change"),
    ({"rate": 1.5}, "$.rate"),
    ({"types": ["rate_limit", "explode"]}, "queue_saturated"),
    ({"script": [{"error": "rate_limit", "count": 0}]}, "$.script[0].count"),
    ({"bogus": 1}, "bogus"),
    ({"retry_after_ms": -1}, "$.retry_after_ms"),
])
async def test_bad_settings_are_a_400_naming_the_field(client, body, named):
    resp = await client.post("/control/faults", json=body)
    assert resp.status == 400
    err = (await resp.json())["error"]
    assert err["code"] == "invalid_request" and named in err["message"]


async def test_an_unknown_model_is_a_404(client):
    resp = await client.post("/control/faults", json={"model": "nope", "rate": 0.5})
    assert resp.status == 404


async def test_reset_puts_everything_back(client):
    await post_faults(client, rate=1.0, script=[{"error": "rate_limit", "count": 5}])
    state = await post_faults(client, reset=True)
    assert state["defaults"]["rate"] == 0 and state["scripts"] == {}
    assert await statuses(client, 2) == [200, 200]


async def test_changes_are_saved_and_restored(fake):
    saved = []
    app = create_app(fake.target, save_faults=saved.append)  # (its snapshots)
    async with TestClient(TestServer(app)) as c:
        await post_faults(c, seed=5, retry_after_ms=100,
                          script=[{"error": "overloaded", "count": 2}])
        assert await statuses(c, 1) == [503]
    restored = FaultState.restore(saved[-1])
    assert restored.seed == 5 and restored.defaults.hints.retry_after_ms == 100
    assert [(s.error, s.count) for s in restored.scripts["*"]] == [("overloaded", 1)]


async def test_script_steps_used_up_are_saved_off_the_loop_and_debounced(fake):
    """A scripted generation request must not rewrite and fsync the whole script on the
    event loop: one write covers every step used up within DEBOUNCE_S, in a worker
    thread, and the last state is written when the server stops."""
    writes: list[tuple[int, dict]] = []
    app = create_app(fake.target, save_faults=lambda snapshot: writes.append(
        (threading.get_ident(), snapshot)))
    loop_thread = threading.get_ident()
    async with TestClient(TestServer(app)) as c:
        await post_faults(c, script=[{"error": "ok", "count": 1000}])
        assert len(writes) == 1  # the change itself: saved before the answer
        started = time.monotonic()
        assert await statuses(c, 50) == [200] * 50
        elapsed = time.monotonic() - started
        during = len(writes) - 1
    assert during <= 1 + elapsed / DEBOUNCE_S  # not one write per request
    assert all(thread != loop_thread for thread, _ in writes)  # never on the loop
    assert writes[-1][1]["scripts"]["*"] == [{"error": "ok", "count": 950}]  # the last state


async def test_a_script_has_at_most_max_script_steps(client):
    resp = await client.post("/control/faults", json={
        "script": [{"error": "ok"}] * (MAX_SCRIPT_STEPS + 1)})
    assert resp.status == 400 and "$.script" in (await resp.json())["error"]["message"]
    await post_faults(client, script=[{"error": "ok"}] * MAX_SCRIPT_STEPS)


# ---- the [fault] table ---------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.toml"
    path.write_text('model = "gpt-oss-20b"\n' + text)
    return path


def test_a_fault_table_sets_rates_hints_and_a_static_directive(tmp_path):
    path = write(tmp_path, '[fault]\nrate = 0.1\ntypes = ["rate_limit"]\nretry_after_ms = 250\n'
                           'mode = "cut_mid_frame"\nutf8 = true\n')
    settings, static = load_fault_tables(tmp_path)
    assert settings["m"].rate == 0.1 and settings["m"].hints.retry_after_ms == 250
    assert static["m"].mode == "cut_mid_frame" and static["m"].utf8
    assert load_fault_tables(path)[0].keys() == {"m"}


@pytest.mark.parametrize("table, key", [
    ("rate = 2", "fault.rate"),
    ('types = ["nope"]', "fault.types"),
    ("bogus = 1", "fault.bogus"),
    ('mode = "explode"', "fault.mode"),
    ("after_chunks = 2", "fault.mode"),
])
def test_a_bad_fault_table_is_refused_with_its_key_path(tmp_path, table, key):
    write(tmp_path, f"[fault]\n{table}\n")
    with pytest.raises(ConfigError) as exc:
        load_fault_tables(tmp_path)
    assert exc.value.path == key and "m.toml" in exc.value.where
