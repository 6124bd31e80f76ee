"""The bare aiohttp SSE server of benchmarks/sse_ceiling.py (run as its own process).

    python benchmarks/_sse_server.py PORT TOKENS PER_WRITE INTERVAL_S

POST /v1/chat/completions streams TOKENS pre-encoded OpenAI-shaped chat chunks, the way
the gateway frames them: the role chunk goes out with the first token(s), PER_WRITE token
events per write, the final chunk and [DONE] with the last tokens. Writes are paced by one
shared ticker (like the gateway's handlers, which all wake on each engine message): every
tick each open stream writes once; INTERVAL_S = 0 ticks as fast as the loop turns;
INTERVAL_S < 0 has no ticker: each handler writes its events back to back (no task switch
per write: an upper bound the gateway's structure cannot reach). Same
runner settings as the gateway (handler cancellation on, no access log), uvloop. GET /health
answers 200.
"""

from __future__ import annotations

import asyncio
import sys

from aiohttp import web

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
               "X-Accel-Buffering": "no"}
ID = "chatcmpl-0123456789abcdef0123456789abcdef"
HEAD = (b'data: {"id":"' + ID.encode() + b'","object":"chat.completion.chunk","created":1700000000,'
        b'"model":"gpt-oss-20b","choices":[{"index":0,"delta":{"role":"assistant","content":""},'
        b'"logprobs":null,"finish_reason":null}]}\n\n')
TOKEN = (b'data: {"id":"' + ID.encode() + b'","object":"chat.completion.chunk","created":1700000000,'
         b'"model":"gpt-oss-20b","choices":[{"index":0,"delta":{"content":" token"},'
         b'"logprobs":null,"finish_reason":null}]}\n\n')
TAIL = (b'data: {"id":"' + ID.encode() + b'","object":"chat.completion.chunk","created":1700000000,'
        b'"model":"gpt-oss-20b","choices":[{"index":0,"delta":{},"logprobs":null,'
        b'"finish_reason":"length"}],"inference_lab":{"queue_time_s":0.0,"ttft_s":0.0,'
        b'"e2e_s":0.0,"preemptions":0}}\n\ndata: [DONE]\n\n')


class Ticker:
    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.loop = asyncio.get_running_loop()
        self.tick = self.loop.create_future()
        self.waiters = 0

    async def run(self) -> None:
        while True:
            if self.waiters:  # someone waits for this tick
                tick, self.tick = self.tick, self.loop.create_future()
                self.waiters = 0
                tick.set_result(None)
                await asyncio.sleep(self.interval)
            else:  # nobody to wake (idle, or every stream waits for drain): do not spin
                await asyncio.sleep(max(self.interval, 0.0005))


async def main(port: int, tokens: int, per_write: int, interval: float) -> None:
    ticker = Ticker(interval)

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers=SSE_HEADERS)
        try:
            await resp.prepare(request)
        except ConnectionError:  # the client left (end of a run)
            return resp
        sent = 0
        head = HEAD
        paced = interval >= 0
        while sent < tokens:
            if paced:
                ticker.waiters += 1
                await ticker.tick
            k = min(per_write, tokens - sent)
            sent += k
            out = head + TOKEN * k
            head = b""
            if sent >= tokens:
                out += TAIL
            try:
                await resp.write(out)
            except ConnectionError:  # the client left (end of a run)
                break
        return resp

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    task = asyncio.get_running_loop().create_task(ticker.run() if interval >= 0 else asyncio.sleep(0))
    try:
        await asyncio.Event().wait()
    finally:
        task.cancel()
        await runner.cleanup()


if __name__ == "__main__":
    import signal

    args = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        import uvloop
        uvloop.run(main(*args))
    except ImportError:
        asyncio.run(main(*args))
    except (KeyboardInterrupt, SystemExit):
        pass
