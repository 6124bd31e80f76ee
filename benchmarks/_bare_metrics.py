"""A bare /metrics server of benchmarks/fleet.py scrape --bare (run as a process of its own).

    python benchmarks/_bare_metrics.py KIND PORT BODY_FILE

Answers every GET with BODY_FILE's bytes (a real replica's /metrics, fetched once before the
window) as `text/plain; version=0.0.4; charset=utf-8`, keep-alive. KIND aiohttp: a plain
aiohttp app with the gateway's runner settings (handler cancellation on, no access log);
KIND asyncio: an asyncio.Protocol that answers each request's head with one prebuilt
response (no HTTP framework at all). Both on uvloop, as the gateway runs. Nothing else runs
in the process: its latency under load is the machine's floor for a scrape of that size,
not the gateway's.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from aiohttp import web

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


async def serve_aiohttp(port: int, body: bytes) -> None:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/{tail:.*}", metrics)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


class Bare(asyncio.Protocol):
    """HTTP/1.1 keep-alive GETs without bodies (what the benchmark's scraper sends)."""

    response = b""

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            self.buffer = self.buffer[end + 4:]
            self.transport.write(self.response)


async def serve_asyncio(port: int, body: bytes) -> None:
    Bare.response = (b"HTTP/1.1 200 OK\r\nContent-Type: " + CONTENT_TYPE.encode() +
                     b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    server = await asyncio.get_running_loop().create_server(Bare, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    kind, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with open(path, "rb") as f:
        body = f.read()
    serve = {"aiohttp": serve_aiohttp, "asyncio": serve_asyncio}[kind]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        import uvloop
        uvloop.run(serve(port, body))
    except ImportError:
        asyncio.run(serve(port, body))
    except (KeyboardInterrupt, SystemExit):
        pass


if __name__ == "__main__":
    main()
