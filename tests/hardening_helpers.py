"""Helpers of the hardening tests: an in-process lab on a background loop (for synchronous
hypothesis tests), a raw HTTP client, the error-envelope check, and the real `engine` and
`gateway` commands as separate processes on free loopback ports."""

from __future__ import annotations

import asyncio
import contextlib
import http.client as httpclient
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Iterator

from serve_helpers import free_port

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


# ---- the real commands as processes -------------------------------------------------------------


class Proc:
    """A command whose output goes to a log file. `close()` kills and reaps it, kills the
    engine children it logged (`serve` starts its engine in a session of its own) and
    removes the log."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self._log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.argv = argv
        self.proc = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        with open(self._log.name) as f:
            return f.read()

    def wait_for_log(self, pattern: str, timeout: float = 30.0) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(pattern, self.log())
            if match:
                return match
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.argv[3:5]} exited {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} in the log within {timeout} s:\n{self.log()}")

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait; SIGKILL if it does not exit in time. The exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"did not exit within {timeout} s of SIGTERM:\n{self.log()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        self.kill()
        for pid in re.findall(r"engine started: pid (\d+)", self.log()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.unlink(self._log.name)


def command(*args: str) -> list[str]:
    return [sys.executable, "-P", "-m", "inference_lab", *args]


@contextlib.contextmanager
def engine_process(*extra: str, port: int | None = None,
                   env: dict[str, str] | None = None) -> Iterator[Proc]:
    """`inference-lab engine` on 127.0.0.1 (a free port unless given); `.port` is its gRPC
    port once it printed `engine ready`."""
    port = port or free_port()
    proc = Proc(command("engine", "--host", "127.0.0.1", "--port", str(port),
                        "--metrics-port", "0", *extra), env)
    try:
        proc.wait_for_log(r"engine ready: grpc 127\.0\.0\.1:\d+")
        proc.port = port
        yield proc
    finally:
        proc.close()


@contextlib.contextmanager
def gateway_process(engine_port: int, *extra: str, port: int | None = None,
                    env: dict[str, str] | None = None) -> Iterator[Proc]:
    """`inference-lab gateway` on a free 127.0.0.1 port in front of the engine; `.port`."""
    port = port or free_port()
    proc = Proc(command("gateway", "--engine", f"127.0.0.1:{engine_port}", "--host",
                        "127.0.0.1", "--port", str(port), *extra), env)
    try:
        proc.wait_for_log(r"gateway listening on http://")
        proc.port = port
        yield proc
    finally:
        proc.close()


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.05):
    """Poll `predicate` (for effects in another process that no event announces)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(interval)
