"""The gate of aiohttp's private state (gateway.aiohttp_gate): the fast paths are on only
for the aiohttp releases they were tested on, which pyproject.toml declares; with them off
(forced here by INFERENCE_LAB_FAST_PATHS, as an untested aiohttp switches them off) the
lab serves through aiohttp's public API alone, and serves the same: streams, complete
answers, 529s before any byte in every dialect's envelope, on kept-alive connections."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import logging
import os
import tomllib
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from engine_helpers import running_engine
from hardening_helpers import content_tokens, exchange, named_events, sse_frames
from inference_lab.gateway import aiohttp_gate, create_app
from inference_lab.gateway.protocols import generate
from inference_lab.gateway.server import start_gateway
from inference_lab.testing.poll import until

MODEL = "gpt-oss-20b"
ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"


async def _equal(value, expected) -> bool:
    """Whether the awaited `value` is `expected` (a predicate for `until`)."""
    return await value == expected


# ---- one gate -----------------------------------------------------------------------------------

# aiohttp's private names the gate reads or writes, and others of its objects (the relay
# reads the protocol's public `writing_paused`, which the gate checks is there)
_PRIVATE = {name for name in (*aiohttp_gate._CONNECTION_STATE, *aiohttp_gate._RESPONSE_STATE)
            if name.startswith("_")} | {"_sock", "_make_server", "_kwargs", "_headers_buf",
                                        "_compress", "_on_chunk_sent", "_protocol", "_parser",
                                        "_transport", "_paused"}


def _sources() -> list[Path]:
    """The lab's modules (the gateway's, the rest of the package's, the tests') that name
    aiohttp, but the gate."""
    paths = list((ROOT / "gateway").rglob("*.py")) + list((ROOT / "tests").rglob("*.py"))
    for sub in (ROOT / "inference_lab").iterdir():  # (its gateway and engine are links)
        if sub.is_dir() and sub.name not in ("gateway", "engine"):
            paths += sub.rglob("*.py")
    return sorted(p for p in paths if p.name != "aiohttp_gate.py" and "aiohttp" in p.read_text())


def test_only_the_gate_imports_aiohttps_internal_modules_or_reads_its_private_state():
    checked = 0
    for path in _sources():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aiohttp."):
                assert node.module == "aiohttp.web" or node.module.startswith("aiohttp.test_utils"), \
                    f"{path}: from {node.module} import"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("aiohttp.") or alias.name == "aiohttp.web", \
                        f"{path}: import {alias.name}"
            elif isinstance(node, ast.Attribute) and node.attr in _PRIVATE:
                raise AssertionError(f"{path}:{node.lineno}: .{node.attr}")
        checked += 1
    assert checked >= 10


# ---- the decision ------------------------------------------------------------------------------


def test_the_tested_range_is_the_one_pyproject_declares():
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    [aiohttp_spec] = [d for d in dependencies if d.startswith("aiohttp")]
    assert aiohttp_spec == "aiohttp" + aiohttp_gate.tested_range()


@pytest.mark.parametrize("version, setting, off", [
    ("3.13.4", None, None),  # the first tested release
    ("3.14.5", "1", None),
    ("3.14.99", "", None),
    ("3.13.3", None, "aiohttp 3.13.3 is outside the range they were tested on"),
    ("3.15.0", None, "aiohttp 3.15.0 is outside"),
    ("3.15.0a1", None, "aiohttp 3.15.0a1 is outside"),
    ("4.0.0", None, "aiohttp 4.0.0 is outside"),
    ("3.9.5", None, "aiohttp 3.9.5 is outside"),
    ("nonsense", None, "aiohttp nonsense is outside"),
    ("3.14.5", "off", "INFERENCE_LAB_FAST_PATHS=off"),
    ("3.14.5", "0", "INFERENCE_LAB_FAST_PATHS=0"),
    ("3.14.5", " OFF ", "INFERENCE_LAB_FAST_PATHS= OFF "),
])
def test_the_fast_paths_are_on_only_for_a_tested_release_unless_forced_off(version, setting, off):
    reason = aiohttp_gate.why_off(version, setting)
    if off is None:
        assert reason is None
    else:
        assert reason is not None and reason.startswith(off)


def test_a_tested_release_lacking_the_state_the_gate_reads_gets_no_fast_paths():
    assert aiohttp_gate.why_off("3.14.5", None, []) is None
    assert aiohttp_gate.why_off("3.14.5", None, ["_messages"]) == "aiohttp 3.14.5 lacks _messages"


def test_the_installed_aiohttp_has_every_name_the_gate_reads():
    # (the CI runs this at both ends of the range)
    assert aiohttp_gate._missing_state() == []
    assert aiohttp_gate.why_off(aiohttp.__version__, None, []) is None


@pytest.fixture
def fast_paths_off(monkeypatch, caplog):
    """The fast paths forced off for the test (and decided afresh after it)."""
    before = os.environ.get(aiohttp_gate.ENV)
    monkeypatch.setenv(aiohttp_gate.ENV, "off")
    with caplog.at_level(logging.WARNING, logger="inference_lab.gateway.aiohttp_gate"):
        assert not aiohttp_gate.decide_again()
        assert not aiohttp_gate.fast_paths()  # (decided once: one log line)
    yield caplog
    if before is None:
        monkeypatch.delenv(aiohttp_gate.ENV)
    else:
        monkeypatch.setenv(aiohttp_gate.ENV, before)
    aiohttp_gate.decide_again()


def test_off_is_said_in_one_log_line(fast_paths_off):
    [record] = fast_paths_off.get_records("setup")
    assert record.getMessage() == ("aiohttp fast paths off (INFERENCE_LAB_FAST_PATHS=off): "
                                   "serving through aiohttp's public API only")


# ---- serving with the fast paths off --------------------------------------------------------------


def post(path: str, body: dict) -> bytes:
    raw = json.dumps(body).encode()
    return (b"POST %s HTTP/1.1\r\nHost: lab\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (path.encode(), len(raw)) + raw)


async def read_chunked(reader: asyncio.StreamReader) -> tuple[bytes, dict, bytes]:
    """(status line, headers, body) of one chunked response."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    status, *lines = head[:-4].split(b"\r\n")
    headers = {k.decode().lower(): v.strip().decode()
               for k, _, v in (line.partition(b":") for line in lines)}
    assert headers["transfer-encoding"] == "chunked"
    body = b""
    while True:
        size = int((await asyncio.wait_for(reader.readuntil(b"\r\n"), 10))[:-2], 16)
        chunk = await asyncio.wait_for(reader.readexactly(size + 2), 10)
        if not size:
            return status, headers, body
        body += chunk[:-2]


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 6}
MESSAGES = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 6}
SATURATED = ("Server is at capacity: 1 requests waiting (max_waiting = 1). "
             "Retry with reduced concurrency.")


@contextlib.asynccontextmanager
async def lab():
    """The real engine (one running place, one waiting) and gateway, served as `serve`
    serves them; yields the gateway's port and its runner."""
    async with running_engine(max_waiting=1, max_num_seqs=1) as engine:
        runner, port = await start_gateway(create_app(f"127.0.0.1:{engine.port}"), "127.0.0.1", 0)
        try:
            yield port, runner
        finally:
            await runner.cleanup()


async def test_with_the_fast_paths_off_the_lab_serves_the_same_through_aiohttps_public_api(
        fast_paths_off, monkeypatch):
    relayed = []
    monkeypatch.setattr(generate._Relay, "__call__", lambda relay, total: relayed.append(total))
    async with lab() as (port, runner), aiohttp.ClientSession() as session:
        assert type(runner) is web.AppRunner  # aiohttp's own: no edge, no stamping listener
        base = f"http://127.0.0.1:{port}"
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            # a stream and a complete answer on one kept-alive connection
            writer.write(post("/v1/chat/completions", {**CHAT, "stream": True}))
            status, headers, body = await read_chunked(reader)
            assert status == b"HTTP/1.1 200 OK"
            assert headers["content-type"].startswith("text/event-stream")
            frames = sse_frames(body)
            assert frames[-1] == b"[DONE]" and content_tokens(frames) == 6
            [(status, _, raw)] = await exchange(writer, reader, post("/v1/chat/completions", CHAT))
            assert status == b"HTTP/1.1 200 OK"
            assert json.loads(raw)["usage"]["completion_tokens"] == 6
            writer.write(post("/v1/messages", {**MESSAGES, "stream": True}))
            status, headers, body = await read_chunked(reader)
            assert status == b"HTTP/1.1 200 OK"
            events = named_events(body)
            assert events[-1][0] == "message_stop"
            assert sum(name == "content_block_delta" for name, _ in events) == 6

            # saturate: one request running, one waiting, both long
            long = {**CHAT, "max_tokens": 100_000, "stream": True}
            holders = []

            async def counts() -> tuple[int, int]:
                async with session.get(base + "/control/capacity") as resp:
                    [row] = await resp.json()
                return row["running"], row["waiting"]

            for places in ((1, 0), (1, 1)):  # the first runs, then the second waits
                holders.append(asyncio.ensure_future(session.post(base + "/v1/chat/completions",
                                                                  json=long)))
                await until(lambda: _equal(counts(), places), timeout=10, what=f"{places} taken")

            # every dialect's 529, before any byte of a stream, on the same kept-alive
            # connection, each twice (the second is where the edge would answer)
            cases = [("/v1/chat/completions", CHAT), ("/v1/chat/completions", {**CHAT, "stream": True}),
                     ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 6}),
                     ("/v1/responses", {"model": MODEL, "input": "hi", "stream": True}),
                     ("/v1/messages", MESSAGES), ("/v1/messages", {**MESSAGES, "stream": True})]
            for path, body in cases:
                for _ in range(2):
                    [(status, headers, raw)] = await exchange(writer, reader, post(path, body))
                    assert status == b"HTTP/1.1 529 ", (path, body, raw)
                    assert headers["content-type"] == "application/json"
                    envelope = json.loads(raw)
                    if path == "/v1/messages":
                        assert envelope == {"type": "error", "error": {
                            "type": "overloaded_error", "message": SATURATED}}
                    else:
                        assert envelope == {"error": {"message": SATURATED,
                                                      "type": "overloaded_error",
                                                      "code": "queue_saturated"}}

            # the queue frees: the same connection is served again
            for holder in holders:
                (await holder).close()
            async def served_again() -> bytes | None:
                [(status, _, raw)] = await exchange(writer, reader, post("/v1/messages", MESSAGES))
                assert status in (b"HTTP/1.1 200 OK", b"HTTP/1.1 529 ")
                return raw if status == b"HTTP/1.1 200 OK" else None

            raw = await until(served_again, timeout=10, what="served again")
            assert json.loads(raw)["usage"]["output_tokens"] == 6
        finally:
            writer.close()
    assert relayed == []  # every token was written by its handler (aiohttp's write)
