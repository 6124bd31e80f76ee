"""Idle connections cannot pile up: the engine's metrics endpoint closes a connection that
sends nothing within its socket timeout (each open connection holds a thread), and a
scrape still answers meanwhile. The real engine, real sockets on loopback."""

from __future__ import annotations

import asyncio
import socket
import threading
import urllib.request

from engine_helpers import running_engine

from inference_lab.engine.service import metrics_http as engine_metrics
from inference_lab.testing.poll import until

IDLE = 40


def handler_threads() -> int:
    """The metrics server's threads, one per open connection (http.server's)."""
    return sum("process_request_thread" in t.name for t in threading.enumerate())


async def test_the_metrics_endpoint_closes_idle_connections_and_frees_their_threads(monkeypatch):
    monkeypatch.setattr(engine_metrics, "METRICS_SOCKET_TIMEOUT_S", 0.5, raising=False)
    loop = asyncio.get_running_loop()
    async with running_engine() as engine:
        idle = [socket.create_connection(("127.0.0.1", engine.metrics_port), timeout=10)
                for _ in range(IDLE)]
        try:
            url = f"http://127.0.0.1:{engine.metrics_port}/metrics"
            body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())
            assert b"vllm:num_requests_waiting" in body  # scrapes go on meanwhile
            for sock in idle:
                sock.setblocking(False)
            # the server's FIN on every one of them, well before this deadline
            got = await asyncio.wait_for(
                asyncio.gather(*(loop.sock_recv(sock, 1) for sock in idle)), timeout=10)
            assert got == [b""] * IDLE
        finally:
            for sock in idle:
                sock.close()
        await until(lambda: handler_threads() == 0, timeout=10)
