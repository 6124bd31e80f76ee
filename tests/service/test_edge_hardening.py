"""The gateway's connections before a request exists, over real sockets: what aiohttp's
HTTP parser refuses gets the JSON envelope, half-sent headers and trickled bodies are cut
off with a 408 instead of holding a file descriptor."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from inference_lab.gateway import create_app
from inference_lab.gateway.edge import reading
from inference_lab.gateway.server import start_gateway
from inference_lab.testing.fake_engine import FAKE_MODEL
from inference_lab.testing.poll import until

HEADER_TIMEOUT = 0.5


@pytest.fixture
async def gateway(fake):
    runner, port = await start_gateway(create_app(fake.target), "127.0.0.1", 0,
                                       header_timeout=HEADER_TIMEOUT)
    yield runner, port
    await runner.cleanup()


async def exchange(port: int, *parts: bytes, pause: float = 0.0,
                   timeout: float = 5.0) -> tuple[bytes, float]:
    """Send the parts (with a pause between), read until the server closes or `timeout`;
    returns what came back and when the last byte did, counted from before the connect
    (the server's timers start when it accepts, which may come before the connect returns
    here: a clock started after it could see a timeout fire early)."""
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for i, part in enumerate(parts):
        if i and pause:  # (a slow client: its slowness is what is tested)
            await asyncio.sleep(pause)
        writer.write(part)
    out = b""
    try:
        async with asyncio.timeout(timeout):
            while chunk := await reader.read(65536):
                out += chunk
    except TimeoutError:
        pass
    writer.close()
    return out, time.monotonic() - started


def response(raw: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, json.loads(body)


MANY_HEADERS = b"".join(b"X-%d: y\r\n" % i for i in range(200))


@pytest.mark.fast_paths
@pytest.mark.parametrize("raw, named", [
    (b"GARBAGE\r\n\r\n", "Invalid method"),
    (b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", "Invalid header token"),
    (b"GET /health HTTP/1.1\r\nHost: x\r\n" + MANY_HEADERS + b"\r\n", "Too many headers"),
    (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n", "8190 bytes"),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
     "chunk size"),
])
async def test_what_the_http_parser_refuses_gets_the_json_envelope(gateway, raw, named):
    _, port = gateway
    out, _ = await exchange(port, raw)
    status, headers, body = response(out)
    assert status == 400 and headers["content-type"].startswith("application/json")
    assert body["error"]["code"] == "bad_http_request" and named in body["error"]["message"]


@pytest.mark.fast_paths
async def test_bad_chunked_framing_after_the_headers_is_a_400_not_a_hang(gateway, fake):
    _, port = gateway
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    out, took = await exchange(port, head, b"zz\r\nabc\r\n", pause=0.2)
    status, _, body = response(out)
    assert status == 400 and "chunk size" in body["error"]["message"]
    assert took < 2 and fake.opened.items == []


@pytest.mark.fast_paths
async def test_half_sent_headers_get_a_408_after_the_header_timeout(gateway):
    _, port = gateway
    out, took = await exchange(port, b"GET /health HTTP/1.1\r\nHost: x\r\n")
    status, headers, body = response(out)
    assert status == 408 and body["error"]["code"] == "request_timeout"
    assert HEADER_TIMEOUT <= took < HEADER_TIMEOUT + 1.5  # and the server closed it


@pytest.mark.fast_paths
async def test_a_silent_connection_and_a_half_sent_second_request_are_cut_off_too(gateway):
    _, port = gateway
    out, took = await exchange(port)  # connects, sends nothing
    assert response(out)[0] == 408 and took < HEADER_TIMEOUT + 1.5
    first = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    out, took = await exchange(port, first, b"GET /health HTTP/1.1\r\nHo", pause=HEADER_TIMEOUT)
    assert out.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 408" in out  # kept alive, then cut


@pytest.mark.fast_paths
async def test_hundreds_of_slowloris_connections_are_all_released(gateway):
    runner, port = gateway
    n = 300
    conns = []
    for _ in range(n):
        # Stamped before the connect starts: the server (on this same loop) may accept and
        # arm its deadline well before this coroutine resumes from the connect.
        opened = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        conns.append((reader, writer, opened))
    out, _ = await exchange(port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200")  # still serving meanwhile

    async def answer(reader, opened):
        return await reader.read(), time.monotonic() - opened

    closed = await asyncio.wait_for(asyncio.gather(*(answer(r, t0) for r, _, t0 in conns)), 20)
    assert all(body.startswith(b"HTTP/1.1 408") for body, _ in closed)
    # Each was held until its header timeout (armed when the server accepted it, which is
    # no earlier than the start of our connect), never dropped early.
    held = sorted(took for _, took in closed)
    assert held[0] >= HEADER_TIMEOUT * 0.9, held[:5]
    await until(lambda: not runner.server.connections, timeout=5, what="every connection released")
    for _, writer, _ in conns:
        writer.close()


async def test_a_stream_longer_than_the_header_timeout_is_not_cut(fake, monkeypatch):
    fake.mode = "hold"  # admitted, then nothing until cancelled
    runner, port = await start_gateway(create_app(fake.target), "127.0.0.1", 0,
                                       header_timeout=HEADER_TIMEOUT)
    try:
        body = json.dumps({"model": FAKE_MODEL, "stream": True, "prompt": "x"}).encode()
        req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body) + body)
        out, took = await exchange(port, req, timeout=HEADER_TIMEOUT * 3)
        assert out.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 408" not in out
        assert took >= HEADER_TIMEOUT * 3 - 0.1  # held open by us, not cut by the server
    finally:
        await runner.cleanup()


async def test_a_trickled_body_gets_a_408(gateway, monkeypatch):
    monkeypatch.setattr(reading, "BODY_TIMEOUT_S", 0.5)
    _, port = gateway
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{\"model\"")
    out, took = await exchange(port, head, timeout=3)
    status, _, body = response(out)
    assert status == 408 and "body not received" in body["error"]["message"]
