"""The floor under the refusal path: a bare aiohttp server answering every request with
the fixed 529 body, driven exactly like `refusal_path.py` drives the gateway (the same
load generator, open loop, keep-alive connections). Reports 529 latency p50/p99/p99.9 and
the server's CPU per request, for comparison with the gateway's. No pass/fail.

    python benchmarks/refusal_floor.py [--rate 2000] [--duration 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import _common as C

BODY = (b'{"error":{"message":"Server is at capacity: 1 requests waiting (max_waiting = 1). '
        b'Retry with reduced concurrency.","type":"overloaded_error","code":"queue_saturated"}}')

SERVER = f"""
import gc, sys, uvloop
from aiohttp import web
BODY = {BODY!r}
async def refuse(request):
    await request.read()
    return web.Response(status=529, body=BODY, content_type="application/json")
app = web.Application()
app.router.add_post("/v1/chat/completions", refuse)
gc.freeze()
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), loop=uvloop.new_event_loop(),
            print=lambda *a: print("ready", flush=True), access_log=None)
"""


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=2000.0, help="requests per second")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of sending")
    parser.add_argument("--conns", type=int, default=32, help="keep-alive connections opened first")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    print(f"machine: {C.machine()}")
    C.print_load(f"bare 529 server at {args.rate:,.0f}/s")
    port = C.free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, text=True)
    loadgens = []
    try:
        if server.stdout.readline().strip() != "ready":
            raise RuntimeError("the bare server did not start")
        count = int(args.rate * args.duration)
        t0 = time.monotonic() + 1.0
        loadgens = C.start_loadgens([{
            "mode": "open", "host": "127.0.0.1", "port": port, "path": "/v1/chat/completions",
            "body": {"model": "gpt-oss-20b", "max_tokens": 16,
                     "messages": [{"role": "user", "content": "Say hello."}]},
            "t0": t0, "t_hard": t0 + args.duration + 10, "conns": args.conns,
            "max_conns": 512, "rate": args.rate, "count": count}])
        time.sleep(max(0.0, t0 - time.monotonic()))
        s0, l0, w0 = C.proc_cpu(server.pid), C.proc_cpu(loadgens[0].pid), time.monotonic()
        (res,) = C.collect_loadgens(loadgens, timeout=args.duration + 30)
        s1, w1 = C.proc_cpu(server.pid), time.monotonic()
    finally:
        C.stop_all(loadgens)
        server.terminate()
        server.wait(timeout=10)
    lat = [r[2] - r[1] for r in res["records"] if r[3] == 529]
    out = {"rate": args.rate, "refused": len(lat), "statuses": res["statuses"],
           "p50": C.quantile(lat, 0.5), "p99": C.quantile(lat, 0.99),
           "p999": C.quantile(lat, 0.999), "server_cores": (s1 - s0) / (w1 - w0),
           "server_us_per_request": 1e6 * (s1 - s0) / max(len(lat), 1)}
    print(f"  {out['refused']:,} refused of {count:,} ({res['statuses']}); 529 latency ms "
          f"(write -> response): p50 {out['p50'] * 1e3:.2f} p99 {out['p99'] * 1e3:.2f} "
          f"p99.9 {out['p999'] * 1e3:.2f}")
    print(f"  server CPU {out['server_cores']:.2f} cores, {out['server_us_per_request']:.0f} "
          f"CPU-us per request")
    C.write_json(args.json, {"machine": C.machine(), "result": out})
    return out


if __name__ == "__main__":
    main()
