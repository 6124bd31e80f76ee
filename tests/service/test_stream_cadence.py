"""Stream cadence through the real engine and the real gateway, read by a real HTTP client:
by default every token is its own SSE event; a forced cap groups mid-stream tokens and
counts it; the first and the last token are never grouped (and, narrowly, the gateway's
relay that writes mid-stream tokens from the dispatcher). Functional, not timed: the
engine's clock runs at 1/5 of the wall's (--time-scale 0.2, ~2.5 ms a step), so a
step's end is far from the next."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from types import SimpleNamespace

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from engine_helpers import running_engine

from inference_lab.gateway import aiohttp_gate, create_app
from inference_lab.gateway.protocols.generate import _Relay

STREAMS = 4
TOKENS = 40


async def read_stream(session: aiohttp.ClientSession, url: str) -> list[int]:
    """Token events (SSE events whose usage so far grew by one token) per read of the body
    that carried any: a write of k tokens is k events, which a client reads at once."""
    body = {"model": "gpt-oss-20b", "stream": True, "max_tokens": TOKENS,
            "messages": [{"role": "user", "content": "Say hello."}],
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    per_read = []
    seen, buffer = 0, b""
    async with session.post(url, json=body) as resp:
        assert resp.status == 200
        async for chunk in resp.content.iter_any():
            buffer += chunk
            *events, buffer = buffer.split(b"\n\n")
            tokens = 0
            for event in events:
                data = event.removeprefix(b"data: ")
                if data == b"[DONE]":
                    continue
                payload = json.loads(data)
                total = payload["usage"]["completion_tokens"]
                if payload["choices"] and total > seen:
                    assert total == seen + 1  # one token per event
                    seen = total
                    tokens += 1
            if tokens:
                per_read.append(tokens)
    assert seen == TOKENS and buffer == b""
    return per_read


async def run_streams(session_lane: str | None = None, time_scale: float = 0.2,
                      **engine_options) -> tuple[list[list[int]], str]:
    async with running_engine(time_scale=time_scale, **engine_options) as engine:
        app = create_app(f"127.0.0.1:{engine.port}", session_lane=session_lane)
        async with TestServer(app) as server:
            url = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            async with aiohttp.ClientSession() as session:
                streams = await asyncio.gather(*(read_stream(session, url)
                                                 for _ in range(STREAMS)))
        metrics = await asyncio.to_thread(
            lambda: urllib.request.urlopen(
                f"http://127.0.0.1:{engine.metrics_port}/metrics").read().decode())
    return streams, metrics


def sample(text: str, name: str) -> float:
    line = next(l for l in text.splitlines() if l.startswith(name + "{"))
    return float(line.rsplit(" ", 1)[1])


@pytest.mark.parametrize("session_lane", ["auto", "off"])  # the Session's two transports
async def test_by_default_every_token_is_its_own_write_and_nothing_is_coalesced(session_lane):
    streams, metrics = await run_streams(session_lane)
    for per_read in streams:
        assert per_read[0] == 1 and per_read[-1] == 1
        # every token its own write; a client busy with its other streams may read two
        # writes at once now and then
        assert sum(per_read) == TOKENS and per_read.count(1) >= 0.8 * len(per_read)
    assert sample(metrics, "inference_lab_coalesced_updates_total") == 0
    assert sample(metrics, "inference_lab_stream_update_interval_seconds") == 0


async def test_a_forced_cap_groups_mid_stream_tokens_never_the_first_or_the_last():
    # 20 updates/s over 4 streams: a running stream's next update 200 ms (wall) after its
    # previous one, while ~40 steps of ~10 ms (--time-scale 0.05) produce its 40 tokens: a
    # step apart even on a loaded machine, so the first token goes alone (a wake-up late by
    # a whole step would hand it over with its successor)
    streams, metrics = await run_streams(time_scale=0.05, update_rate=20.0)
    for per_read in streams:
        assert sum(per_read) == TOKENS
        assert per_read[0] == 1 and per_read[-1] == 1
        assert max(per_read[1:-1]) > 5
        assert len(per_read) < TOKENS / 2
    assert sample(metrics, "inference_lab_coalesced_updates_total") > 0
    # S / 20 s with S live streams when an update was last held: 4 to 1 of them
    assert 0.05 <= sample(metrics, "inference_lab_stream_update_interval_seconds") <= 0.2


# ---- the gateway's relay (mid-stream tokens written by the dispatcher), narrowly --------
class Protocol:  # the slice of aiohttp's connection protocol the relay reads
    def __init__(self) -> None:
        self.transport = object()
        self.writing_paused = False


class Response:
    def __init__(self, fail: BaseException | None = None) -> None:
        self.written: list[bytes] = []
        self.fail = fail

    async def write(self, data: bytes) -> None:
        if self.fail is not None:
            raise self.fail
        self.written.append(data)


class Reply:
    def opening(self) -> bytes:
        return b"<open>"

    def tokens(self, index: int, k: int) -> bytes:
        return b"t" * k


def relay_for(resp: Response) -> tuple[_Relay, Protocol]:
    protocol = Protocol()
    return _Relay(SimpleNamespace(protocol=protocol), resp, Reply()), protocol


def test_the_relay_writes_each_new_total_once_without_waiting_the_opening_with_the_first():
    resp = Response()
    relay, _ = relay_for(resp)
    assert relay(3) and relay(3) and relay(5)
    assert resp.written == [b"<open>ttt", b"tt"] and relay.streamed == 5


def test_the_relay_leaves_the_write_to_the_handler_when_the_socket_pushes_back_or_is_gone():
    resp = Response()
    relay, protocol = relay_for(resp)
    protocol.writing_paused = True  # the client reads slowly: the pump writes and drains
    assert not relay(2)
    protocol.writing_paused, protocol.transport = False, None  # the client went away
    assert not relay(2)
    assert resp.written == [] and relay.streamed == 0  # the pump writes those tokens
    assert relay.head == b"<open>"  # (and the opening with them)


def test_a_failed_relay_write_is_kept_for_the_handler_and_never_raised_to_the_dispatcher():
    relay, _ = relay_for(Response(fail=ConnectionResetError("gone")))
    assert not relay(1)
    assert isinstance(relay.error, ConnectionResetError)
    assert not relay(2)  # nothing more is tried


@pytest.mark.fast_paths
async def test_after_the_opening_the_relay_writes_chunks_past_aiohttps_writer_byte_for_byte():
    """Over a real aiohttp response: the first write (with the headers) is aiohttp's, the
    later ones are chunks written to the transport; the client reads the same chunked body,
    and the writer's counts include them (as its own writes would)."""
    from aiohttp import web
    seen: dict[str, object] = {}

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        relay = _Relay(request, resp, Reply())
        calls = []
        write = resp.write
        resp.write = lambda data: (calls.append(data), write(data))[1]
        assert relay(1) and relay(3) and relay(6)
        seen["aiohttp writes"] = list(calls)
        seen["output"] = aiohttp_gate.bytes_written(resp)
        await write(b"<close>")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/s", handler)
    async with TestServer(app) as server, aiohttp.ClientSession() as session:
        async with session.get(server.make_url("/s")) as resp:
            assert resp.headers["Transfer-Encoding"] == "chunked"
            body = await resp.read()
    assert body == b"<open>t" + b"tt" + b"ttt" + b"<close>"
    assert seen["aiohttp writes"] == [b"<open>t"]  # the later two bypassed it
    framed = len(b"7\r\n<open>t\r\n2\r\ntt\r\n3\r\nttt\r\n")
    assert seen["output"] >= framed  # (plus the headers, which aiohttp counts as well)
