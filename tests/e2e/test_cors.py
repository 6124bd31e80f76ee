"""A web page on another origin calls the API as it calls vLLM (whose default CORS policy
allows any origin): the browser's preflight is answered, before any API key is checked, and
every response to a request with an Origin allows it. Real serve, real HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from inference_lab.testing.launch import serve

BODY = json.dumps({"model": "gpt-oss-20b", "messages": [{"role": "user", "content": "hi"}],
                   "max_tokens": 2}).encode()


def call(base: str, method: str, path: str, headers: dict, data: bytes | None = None):
    req = urllib.request.Request(base + path, method=method, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def test_preflight_and_origin_are_answered_as_vllm_does_even_with_an_api_key():
    with serve("--api-key", "sekret") as s:
        status, headers, body = call(s.base, "OPTIONS", "/v1/chat/completions", {
            "Origin": "http://page.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert status == 200 and body == b"OK"
        assert headers["Access-Control-Allow-Origin"] == "*"
        assert "POST" in headers["Access-Control-Allow-Methods"]
        assert headers["Access-Control-Allow-Headers"] == "authorization, content-type"
        status, headers, _ = call(s.base, "POST", "/v1/chat/completions", {
            "Origin": "http://page.example", "Content-Type": "application/json",
            "Authorization": "Bearer sekret"}, BODY)
        assert status == 200 and headers["Access-Control-Allow-Origin"] == "*"
        status, headers, body = call(s.base, "POST", "/v1/chat/completions", {
            "Origin": "http://page.example", "Content-Type": "application/json"}, BODY)
        assert status == 401 and headers["Access-Control-Allow-Origin"] == "*"  # readable
        status, headers, body = call(s.base, "OPTIONS", "/health", {})  # not a preflight
        assert status == 405 and json.loads(body)["error"]["code"] == "method_not_allowed"
        assert "Access-Control-Allow-Origin" not in headers
