"""Helpers of the tests that talk HTTP: an in-process lab on a background loop (for
synchronous hypothesis tests), a raw HTTP client, a JSON one, the error-envelope checks and
SSE parsing, and the reads the gateway's edge takes. The real commands as processes:
inference_lab.testing.launch."""

from __future__ import annotations

import asyncio
import http.client as httpclient
import json
import threading
import urllib.error
import urllib.request
from typing import Any

ENVELOPE_KEYS = {"message", "type", "code"}


# ---- an in-process engine + gateway on a loop of their own ----------------------------------


class ThreadedLab:
    """The real engine (gpt-oss-20b on b200) and gateways in front of it, served from a
    background thread's event loop, so that synchronous code (hypothesis) can drive them
    over real sockets. `gateways` maps a name to create_app keyword arguments."""

    def __init__(self, gateways: dict[str, dict[str, Any]], engine_kwargs: dict | None = None):
        self._gateway_kwargs = gateways
        self._engine_kwargs = engine_kwargs or {}
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="lab-loop", daemon=True)
        self.engine = None
        self.ports: dict[str, int] = {}
        self._runners: list = []

    def run(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> "ThreadedLab":
        self._thread.start()
        self.run(self._start())
        return self

    async def _start(self) -> None:
        from inference_lab.engine.sim.config import default_deployments
        from inference_lab.engine.service.server import EngineServer
        from inference_lab.gateway import create_app
        from inference_lab.gateway.server import start_gateway

        self.engine = EngineServer(default_deployments("b200"), "127.0.0.1", 0, 0,
                                   **self._engine_kwargs)
        await self.engine.start()
        for name, kwargs in self._gateway_kwargs.items():
            runner, port = await start_gateway(
                create_app(f"127.0.0.1:{self.engine.port}", **kwargs), "127.0.0.1", 0)
            self._runners.append(runner)
            self.ports[name] = port

    def stop(self) -> None:
        try:
            if self._thread.is_alive():
                self.run(self._stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)

    async def _stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        if self.engine is not None:
            await self.engine.stop(grace=0.0)


# ---- HTTP ------------------------------------------------------------------------------------


def http(port: int, method: str, path: str, body: bytes | None = None,
         headers: dict[str, Any] | None = None, timeout: float = 30.0,
         chunked: bool = False) -> tuple[int, dict[str, str], bytes]:
    """One request on a fresh connection; (status, lower-cased headers, whole body).
    Header values may be bytes (sent as they are). `chunked` sends the body in chunks
    without a Content-Length."""
    conn = httpclient.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for key, value in (headers or {}).items():
            conn.putheader(key, value)
        if body is not None and chunked:
            conn.putheader("Transfer-Encoding", "chunked")
            conn.endheaders()
            try:
                for i in range(0, len(body), 65536):
                    part = body[i:i + 65536]
                    conn.send(b"%x\r\n%s\r\n" % (len(part), part))
                conn.send(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused early: the response is still there to read
        else:
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            try:
                conn.endheaders(body)
            except (BrokenPipeError, ConnectionResetError):
                pass
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()


async def exchange(writer: asyncio.StreamWriter, reader: asyncio.StreamReader, raw: bytes,
                   answers: int = 1, whole: bool = False) -> list[tuple[bytes, dict, bytes]]:
    """Writes `raw` on an open connection and reads `answers` Content-Length responses:
    (status line, headers by lower-case name, body; with `whole`, the response's bytes)."""
    writer.write(raw)
    out = []
    for _ in range(answers):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        status, *lines = head[:-4].split(b"\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(b":")
            headers[name.decode().lower()] = value.strip().decode()
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 5)
        out.append((status, headers, head + body if whole else body))
    return out


def json_request(base: str, method: str, path: str, body=None, raw: str | None = None,
                 token: str | None = None) -> tuple[int, dict | list | None]:
    """One JSON request with urllib: (status, parsed body, None when empty), error statuses
    included. The body is `body` as JSON, or the text `raw` as it is; `token` goes as a
    bearer token."""
    data = raw.encode() if raw is not None else json.dumps(body).encode() if body is not None else None
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    req = urllib.request.Request(base + path, method=method, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            answer = resp.read()
            return resp.status, json.loads(answer) if answer else None
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def _json_4xx(status: int, headers: dict[str, str], body: bytes,
              allowed: tuple[int, ...] | None) -> dict:
    """A 4xx (one of `allowed`) with a JSON body and no trace; the parsed body."""
    assert 400 <= status < 500, (status, body[:300])
    if allowed is not None:
        assert status in allowed, (status, body[:300])
    assert headers.get("content-type", "").startswith("application/json"), (status, headers)
    assert b"Traceback" not in body and b'File "' not in body, body[:300]
    return json.loads(body)


def assert_error_envelope(status: int, headers: dict[str, str], body: bytes,
                          allowed: tuple[int, ...] | None = None) -> dict:
    """A 4xx carrying exactly {"error": {"message", "type", "code"}} as JSON, no trace."""
    doc = _json_4xx(status, headers, body, allowed)
    assert set(doc) == {"error"} and set(doc["error"]) == ENVELOPE_KEYS, doc
    err = doc["error"]
    assert isinstance(err["message"], str) and err["message"], doc
    assert isinstance(err["type"], str) and isinstance(err["code"], str), doc
    return err


def assert_anthropic_envelope(status: int, headers: dict[str, str], body: bytes,
                              allowed: tuple[int, ...] | None = None) -> dict:
    """A 4xx carrying exactly Anthropic's {"type": "error", "error": {"type", "message"}}."""
    doc = _json_4xx(status, headers, body, allowed)
    assert set(doc) == {"type", "error"} and doc["type"] == "error", doc
    err = doc["error"]
    assert set(err) == {"type", "message"}, doc
    assert isinstance(err["message"], str) and err["message"], doc
    assert isinstance(err["type"], str) and err["type"].endswith("_error") or \
        err["type"] == "request_too_large", doc
    return err


def named_events(body: bytes) -> list[tuple[str, dict]]:
    """(event name, data) of each named SSE event (Anthropic, OpenAI Responses)."""
    out = []
    for block in body.split(b"\n\n"):
        if block.startswith(b"event: "):
            name, _, data = block.partition(b"\n")
            out.append((name[len(b"event: "):].decode(), json.loads(data[len(b"data: "):])))
    return out


def sse_frames(body: bytes) -> list[bytes]:
    return [f[len(b"data: "):] for f in body.split(b"\n\n") if f.startswith(b"data: ")]


def content_tokens(frames: list[bytes], echo: bool = False) -> int:
    """Frames carrying one generated token (chat delta content or completion text), over
    every choice; with `echo`, each choice's first text (the prompt) is not one."""
    n = 0
    echoed: set[int] = set()
    for frame in frames:
        if frame == b"[DONE]":
            continue
        doc = json.loads(frame)
        for choice in doc.get("choices") or ():
            delta = choice.get("delta")
            text = delta.get("content") if delta is not None else choice.get("text")
            if echo and choice.get("index", 0) not in echoed:
                echoed.add(choice.get("index", 0))
                continue
            if text:
                n += 1
    return n


def record_reads(monkeypatch) -> list[bytes]:
    """Every read the gateway's edge connections take from now on, in order (so a test
    can wait for the gateway to have read the first part of a split request)."""
    from inference_lab.gateway.edge import EdgeRequestHandler

    reads: list[bytes] = []
    original = EdgeRequestHandler.data_received

    def recorded(self, data: bytes) -> None:
        reads.append(data)
        original(self, data)

    monkeypatch.setattr(EdgeRequestHandler, "data_received", recorded)
    return reads
