"""Mixed chat and embeddings: does each route keep its modelled times under the other's load?

A fresh `inference-lab serve` (gpt-oss-20b and an embedding model, each on its own
modelled GPU) is loaded by closed loops of clients for --duration seconds after a
--warmup: --chat streaming chat completions (max_tokens --max-tokens) and --embed
embeddings requests (--inputs inputs of --input-tokens random token IDs each, from
--bodies bodies per client made before the run, so no two requests of a client's first
--bodies share a prefix), 24 streams in all by default, each route's clients in a
process of their own. Then, when --alone is given,
each route again by itself with the same client count. For each route and run:

- requests completed in the window, and per request the client-observed end-to-end time
  (request write -> end of the body; chat: also the first content event, TTFT) next to
  the engine's modelled one from the response's "inference_lab" field;
- p50 of each, and the median per-request ratio client / modelled;
- with --alone: each route's modelled p50 under the mixed load against its own alone,
  in percent (the target: within 2 %).

No pass/fail: it prints figures (and writes them with --json). Bounded: every client
stops at the window's end, and at most --max-requests requests per client.

    python benchmarks/mixed_pooling.py [--chat 12] [--embed 12] [--duration 10]
        [--warmup 2] [--alone] [--hardware b200] [--embed-model qwen3-embedding-0.6b]
        [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np

import _common as C

CHAT_MODEL = "gpt-oss-20b"


def configs(embed_model: str) -> str:
    directory = tempfile.mkdtemp(prefix="mixed-pooling-")
    for name in (CHAT_MODEL, embed_model):
        shutil.copy(C.ROOT / "configs" / f"{name}.toml", Path(directory) / f"{name}.toml")
    return directory


async def chat_one(session: aiohttp.ClientSession, url: str, body: str) -> tuple:
    """One streaming chat request: (client e2e, modelled e2e, client TTFT, modelled TTFT),
    or ("error", status)."""
    sent = time.monotonic()
    first = None
    modelled = None
    async with session.post(url, data=body, headers={"content-type": "application/json"}) as r:
        if r.status != 200:
            await r.read()
            return ("error", r.status)
        async for line in r.content:
            if first is None and b'"content":" token"' in line:
                first = time.monotonic()
            if b'"inference_lab"' in line:
                modelled = json.loads(line[len(b"data: "):])["inference_lab"]
    end = time.monotonic()
    if modelled is None:
        return ("error", "no inference_lab field")
    return (end - sent, modelled["e2e_s"], (first or end) - sent, modelled["ttft_s"], sent, end)


def chat_body(args) -> str:
    return json.dumps({"model": CHAT_MODEL, "stream": True, "max_tokens": args.max_tokens,
                       "messages": [{"role": "user", "content": "Tell me a story."}]})


async def chat_client(session: aiohttp.ClientSession, url: str, args, stop: float,
                      measure_from: float, out: list) -> None:
    body = chat_body(args)
    for _ in range(args.max_requests):
        if time.monotonic() >= stop:
            return
        row = await chat_one(session, url, body)
        if row[0] == "error" or (row[4] >= measure_from and row[5] <= stop):
            out.append(row[:4])


def embed_bodies(args, seed: int) -> list[bytes]:
    """--bodies distinct request bodies (random token IDs: no prefix shared), made before
    the run so that the client's own CPU does not pace it; a client cycles through them."""
    rng = np.random.default_rng(seed)
    return [json.dumps({"model": args.embed_model, "encoding_format": "base64",  # as the SDK asks
                        "input": rng.integers(1, 2**31, (args.inputs, args.input_tokens)).tolist()}).encode()
            for _ in range(args.bodies)]


async def embed_one(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple:
    sent = time.monotonic()
    async with session.post(url, data=body, headers={"content-type": "application/json"}) as r:
        raw = await r.read()
    end = time.monotonic()
    if r.status != 200:
        return ("error", r.status)
    modelled = json.loads(raw)["inference_lab"]
    return (end - sent, modelled["e2e_s"], None, modelled["ttft_s"], sent, end)


async def embed_client(session: aiohttp.ClientSession, url: str, args, stop: float,
                       measure_from: float, out: list, bodies: list[bytes]) -> None:
    for i in range(args.max_requests):
        if time.monotonic() >= stop:
            return
        row = await embed_one(session, url, bodies[i % len(bodies)])
        if row[0] == "error" or (row[4] >= measure_from and row[5] <= stop):
            out.append(row[:4])


def schedule(rate: float, seconds: float, seed: int) -> list[float]:
    """Poisson arrival instants (s from the start) at `rate` per second for `seconds`: the
    same list for the same seed, so a route's arrivals are the same mixed and alone."""
    rng = np.random.default_rng(seed)
    times, t = [], 0.0
    while True:
        t += rng.exponential(1.0 / rate)
        if t >= seconds:
            return times
        times.append(t)


async def open_loop(session: aiohttp.ClientSession, url: str, one, bodies: list, start: float,
                    measure_from: float, stop: float, rate: float, seed: int, out: list) -> None:
    """Each request sent at its scheduled instant, whatever the others' progress; rows of
    requests sent in the window (all of them, however long they take)."""
    tasks = []
    for i, at in enumerate(schedule(rate, stop - start, seed)):
        await asyncio.sleep(max(0.0, start + at - time.monotonic()))
        tasks.append((start + at, asyncio.ensure_future(one(session, url, bodies[i % len(bodies)]))))
    for at, task in tasks:
        row = await task
        if row[0] == "error" or at >= measure_from:
            out.append(row[:4])


async def clients(base: str, args, route: str, count: int, start: float) -> list:
    """One route's closed loops, in this process (each route has a process of its own, so
    that one route's client work never delays the other's reads)."""
    measure_from = start + args.warmup
    stop = measure_from + args.duration
    out: list = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=args.warmup + args.duration + 60)
    if route == "embeddings":
        bodies = [embed_bodies(args, i) for i in range(count)]
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        if args.open:
            url = base + ("/v1/chat/completions" if route == "chat" else "/v1/embeddings")
            one, pool = (chat_one, [chat_body(args)]) if route == "chat" else (embed_one, [b for mine in bodies for b in mine])
            rate = args.chat_rate if route == "chat" else args.embed_rate
            await asyncio.wait_for(
                open_loop(session, url, one, pool, start, measure_from, stop, rate,
                          seed=1 if route == "chat" else 2, out=out),
                args.warmup + args.duration + 60)
            return out
        if route == "chat":
            tasks = [chat_client(session, base + "/v1/chat/completions", args, stop,
                                 measure_from, out) for _ in range(count)]
        else:
            tasks = [embed_client(session, base + "/v1/embeddings", args, stop, measure_from,
                                  out, bodies[i]) for i in range(count)]
        await asyncio.wait_for(asyncio.gather(*tasks), args.warmup + args.duration + 60)
    return out


def _clients_process(base: str, args, route: str, count: int, start: float, queue) -> None:
    queue.put((route, asyncio.run(clients(base, args, route, count, start))))


def load(base: str, args, chat: int, embed: int) -> dict[str, list]:
    # (the clients' bodies are made first: about a second per 10^8 token IDs)
    start = time.monotonic() + 2.0 + (embed * args.bodies * args.inputs * args.input_tokens) / 1e8
    queue = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=_clients_process,
                                     args=(base, args, route, count, start, queue))
             for route, count in (("chat", chat), ("embeddings", embed)) if count]
    for proc in procs:
        proc.start()
    results = dict(queue.get(timeout=args.warmup + args.duration + 300) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    return results


def summary(rows: list) -> dict:
    ok = [r for r in rows if r[0] != "error"]
    errors = len(rows) - len(ok)
    if not ok:
        return {"requests": 0, "errors": errors}
    client = [r[0] for r in ok]
    modelled = [r[1] for r in ok]
    out = {"requests": len(ok), "errors": errors,
           "client_e2e_p50_s": statistics.median(client),
           "modelled_e2e_p50_s": statistics.median(modelled),
           "e2e_ratio_p50": statistics.median(c / m for c, m in zip(client, modelled) if m > 0),
           "modelled_e2e_mean_s": statistics.fmean(modelled),
           "modelled_ttft_p50_s": statistics.median(r[3] for r in ok)}
    if ok[0][2] is not None:
        out["client_ttft_p50_s"] = statistics.median(r[2] for r in ok)
    return out


def run(args, chat: int, embed: int) -> dict:
    with C.serve("--config", configs(args.embed_model), "--hardware", args.hardware) as served:
        before = C.proc_cpu(served.gateway_pid), C.proc_cpu(served.engine_pid)
        results = load(served.base, args, chat, embed)
        after = C.proc_cpu(served.gateway_pid), C.proc_cpu(served.engine_pid)
    report = {route: summary(rows) for route, rows in results.items()}
    report["cpu_s"] = {"gateway": after[0] - before[0], "engine": after[1] - before[1]}
    return report


def show(label: str, report: dict) -> None:
    print(f"== {label} (gateway {report['cpu_s']['gateway']:.1f} CPU-s, "
          f"engine {report['cpu_s']['engine']:.1f} CPU-s)")
    for route in ("chat", "embeddings"):
        r = report.get(route)
        if not r:
            continue
        line = (f"  {route:<10} {r['requests']:5d} requests ({r['errors']} errors)  e2e p50 "
                f"client {r.get('client_e2e_p50_s', 0) * 1e3:8.2f} ms  modelled "
                f"{r.get('modelled_e2e_p50_s', 0) * 1e3:8.2f} ms  client/modelled "
                f"{(r.get('e2e_ratio_p50', 0) - 1) * 100:+.2f} %")
        if "client_ttft_p50_s" in r:
            line += (f"  TTFT p50 client {r['client_ttft_p50_s'] * 1e3:.2f} ms, modelled "
                     f"{r['modelled_ttft_p50_s'] * 1e3:.2f} ms")
        print(line)


def main() -> None:
    # every flag's help ends with its default, as argparse writes it
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--chat", type=int, default=12, help="streaming chat clients")
    p.add_argument("--embed", type=int, default=12, help="embeddings clients")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds before it")
    p.add_argument("--max-tokens", type=int, default=200, help="chat reply length")
    p.add_argument("--inputs", type=int, default=4, help="inputs per embeddings request")
    p.add_argument("--input-tokens", type=int, default=512, help="tokens per input")
    p.add_argument("--bodies", type=int, default=200,
                   help="distinct embeddings bodies per client, cycled")
    p.add_argument("--max-requests", type=int, default=100_000, help="per client, at most")
    p.add_argument("--hardware", default="b200", help="hardware preset")
    p.add_argument("--embed-model", default="qwen3-embedding-0.6b",
                   help="embedding model of configs/")
    p.add_argument("--alone", action="store_true", help="also run each route by itself")
    p.add_argument("--open", action="store_true",
                   help="open loops instead of closed ones: each route's requests sent on a "
                        "seeded Poisson schedule (--chat-rate, --embed-rate), the same one "
                        "mixed and alone, so the modelled times compare like for like")
    p.add_argument("--chat-rate", type=float, default=20.0, help="with --open: chat requests/s")
    p.add_argument("--embed-rate", type=float, default=50.0,
                   help="with --open: embeddings requests/s (their bodies are the --embed "
                        "clients' --bodies, none sent twice below that many requests)")
    p.add_argument("--json", help="write the figures to this file")
    args = p.parse_args()
    C.print_load("before")
    reports = {"mixed": run(args, args.chat, args.embed)}
    kind = (f"open loops, {args.chat_rate:g} chat + {args.embed_rate:g} embeddings requests/s"
            if args.open else f"{args.chat} chat + {args.embed} embeddings streams")
    show(f"mixed: {kind}", reports["mixed"])
    if args.alone:
        reports["chat_alone"] = run(args, args.chat, 0)
        show("chat alone: " + (f"{args.chat_rate:g} requests/s" if args.open else
                                f"{args.chat} streams"), reports["chat_alone"])
        reports["embeddings_alone"] = run(args, 0, args.embed)
        show("embeddings alone: " + (f"{args.embed_rate:g} requests/s" if args.open else
                                      f"{args.embed} streams"), reports["embeddings_alone"])
        for route in ("chat", "embeddings"):
            for stat in ("p50", "mean"):
                mixed = reports["mixed"].get(route, {}).get(f"modelled_e2e_{stat}_s")
                alone = reports[f"{route}_alone"].get(route, {}).get(f"modelled_e2e_{stat}_s")
                if mixed and alone:
                    print(f"  {route}: modelled e2e {stat} mixed vs alone "
                          f"{(mixed / alone - 1) * 100:+.2f} %")
    C.print_load("after")
    C.write_json(args.json, reports)


if __name__ == "__main__":
    main()
