"""vLLM's dev mode through the real `serve`: with --dev-mode (or vLLM's own switch,
VLLM_SERVER_DEV_MODE=1) /pause holds a tokens-in request of /inference/v1/generate until
/resume, /is_paused says so, /reset_prefix_cache answers; without it those routes are
404s, as in vLLM."""

from __future__ import annotations

import threading

import pytest
from hardening_helpers import json_request

from inference_lab.testing.launch import serve
from inference_lab.testing.poll import wait_until


def call(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, dict | None]:
    return json_request(f"http://127.0.0.1:{port}", method, path, body)


def capacity(port: int) -> dict:
    return call(port, "GET", "/control/capacity")[1][0]


@pytest.mark.parametrize("switch", [("--dev-mode",), ()], ids=["flag", "variable"])
def test_pause_holds_a_generate_request_until_resume(switch):
    env = {} if switch else {"VLLM_SERVER_DEV_MODE": "1"}
    with serve(*switch, env=env) as served:
        port = served.port
        assert call(port, "POST", "/pause?mode=abort") == (200, {"status": "paused"})
        assert call(port, "GET", "/is_paused") == (200, {"is_paused": True})
        answers = []
        held = threading.Thread(target=lambda: answers.append(call(
            port, "POST", "/inference/v1/generate",
            {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 3}})))
        held.start()
        wait_until(lambda: capacity(port)["waiting"] == 1, what="the request queued")
        assert not answers and capacity(port)["running"] == 0
        assert call(port, "POST", "/resume") == (200, {"status": "resumed"})
        held.join(30)
        (status, body), = answers
        assert status == 200 and len(body["choices"][0]["token_ids"]) == 3
        assert call(port, "POST", "/reset_prefix_cache") == (200, None)


def test_without_dev_mode_the_dev_routes_are_404():
    with serve(env={"VLLM_SERVER_DEV_MODE": "0"}) as served:
        for method, path in (("POST", "/pause"), ("POST", "/resume"), ("GET", "/is_paused"),
                             ("POST", "/reset_prefix_cache")):
            assert call(served.port, method, path)[0] == 404, path
        # the generate route is not a dev route
        status, _ = call(served.port, "POST", "/inference/v1/generate",
                         {"token_ids": [1], "sampling_params": {"max_tokens": 1}})
        assert status == 200
