"""A response the client stops reading: once the socket pushes back, the connection must
make progress within the send timeout or be aborted (its handler ends as on a hang-up);
a client that reads slowly keeps its connection."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from aiohttp import web

from inference_lab.gateway import edge
from inference_lab.gateway.edge import sending
from inference_lab.testing.poll import until

SEND_TIMEOUT = 0.5
BODY = b"x" * (2 << 20)  # far more than the (small) socket buffers on both sides take


@pytest.fixture
async def served(monkeypatch):
    monkeypatch.setattr(sending, "SEND_TIMEOUT_S", SEND_TIMEOUT)
    ended: list[str] = []

    async def big(request: web.Request) -> web.StreamResponse:
        sock = request.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * 1024)
        resp = web.StreamResponse()
        await resp.prepare(request)
        try:
            for at in range(0, len(BODY), 64 * 1024):
                await resp.write(BODY[at:at + 64 * 1024])
            await resp.write_eof()
            ended.append("sent")
        except (ConnectionError, asyncio.CancelledError):
            ended.append("cut")
            raise
        return resp

    app = web.Application()
    app.router.add_get("/big", big)
    runner = edge.runner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield runner.addresses[0][1], ended
    await runner.cleanup()


def small_window_client(port: int, window: int = 4096) -> socket.socket:
    c = socket.socket()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, window)
    c.connect(("127.0.0.1", port))
    c.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
    c.setblocking(False)
    return c


@pytest.mark.fast_paths
async def test_a_client_that_stops_reading_is_cut_off_after_the_send_timeout(served):
    port, ended = served
    c = small_window_client(port)
    started = time.monotonic()
    await until(lambda: ended, timeout=10, what="the response ended")
    c.close()
    assert ended == ["cut"]
    assert SEND_TIMEOUT <= time.monotonic() - started < SEND_TIMEOUT + 3


@pytest.mark.fast_paths
async def test_a_client_that_reads_slowly_keeps_its_connection(served):
    port, ended = served
    c = small_window_client(port, 64 * 1024)
    got = 0
    loop = asyncio.get_running_loop()
    while not ended or got < len(BODY):
        # the client's slowness is what is tested: pauses shorter than the timeout
        await asyncio.sleep(SEND_TIMEOUT / 5)
        try:
            chunk = await asyncio.wait_for(loop.sock_recv(c, 256 * 1024), 5)
        except TimeoutError:
            break
        if not chunk:
            break
        got += len(chunk)
    c.close()
    assert ended == ["sent"] and got > len(BODY)
