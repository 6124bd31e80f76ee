"""The reference page's experiment through HTTP, on one running server.

24 closed-loop streaming clients, 200-token responses, gpt-oss-20b on b200: after 1 s of
warm-up load, measure end-to-end latency and throughput; then POST max_num_seqs 8 to the
same running server and measure again. The page says ~293 ms, then ~646 ms with
throughput down by about the same factor.

    python benchmarks/reference_experiment.py [--seconds 8] [--clients 24]

Starts `inference-lab serve` on free loopback ports; prints figures, no pass/fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time

import _common as C
import aiohttp


async def stream_once(session: aiohttp.ClientSession, url: str, max_tokens: int) -> tuple[float, int, dict]:
    body = {"model": "gpt-oss-20b", "stream": True, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "Tell me a story."}]}
    start = time.perf_counter()
    tokens, modelled = 0, {}
    async with session.post(url, json=body) as resp:
        assert resp.status == 200, resp.status
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                if choice.get("delta", {}).get("content"):
                    tokens += 1
            modelled = chunk.get("inference_lab", modelled)
    return time.perf_counter() - start, tokens, modelled


async def phase(session, url, clients: int, seconds: float, max_tokens: int) -> dict:
    """Closed loop for `seconds`; requests that started inside the window count."""
    deadline = time.perf_counter() + seconds
    results = []

    async def user():
        while time.perf_counter() < deadline:
            results.append(await stream_once(session, url, max_tokens))

    start = time.perf_counter()
    await asyncio.gather(*(user() for _ in range(clients)))
    wall = time.perf_counter() - start
    e2e = sorted(r[0] for r in results)
    assert all(r[1] == max_tokens for r in results), "a stream carried the wrong token count"
    return {
        "requests": len(results),
        "p50_ms": 1000 * statistics.median(e2e),
        "p99_ms": 1000 * e2e[min(len(e2e) - 1, int(0.99 * len(e2e)))],
        "modelled_p50_ms": 1000 * statistics.median(r[2]["e2e_s"] for r in results),
        "tokens_per_s": sum(r[1] for r in results) / wall,
    }


async def main_async(args) -> None:
    with C.serve() as served:
        url = served.base + "/v1/chat/completions"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            await phase(session, url, args.clients, 1.0, args.max_tokens)  # warm-up load
            wide = await phase(session, url, args.clients, args.seconds, args.max_tokens)
            async with session.post(served.base + "/control/capacity", json={"max_num_seqs": 8}) as resp:
                assert resp.status == 200
            await phase(session, url, args.clients, 1.0, args.max_tokens)  # settle into cohorts
            narrow = await phase(session, url, args.clients, args.seconds, args.max_tokens)
    print(f"{args.clients} streaming clients, {args.max_tokens}-token responses, "
          f"{args.seconds:.0f} s per phase (load average {os.getloadavg()[0]:.2f})")
    for name, r, target in (("max_num_seqs 256", wide, 293), ("max_num_seqs 8", narrow, 646)):
        print(f"{name:>17}: p50 e2e {r['p50_ms']:7.1f} ms (page {target} ms, modelled p50 "
              f"{r['modelled_p50_ms']:.1f} ms), p99 {r['p99_ms']:7.1f} ms, "
              f"{r['tokens_per_s']:,.0f} tok/s, {r['requests']} requests")
    print(f"throughput ratio 256/8: {wide['tokens_per_s'] / narrow['tokens_per_s']:.2f} "
          f"(e2e ratio {narrow['p50_ms'] / wide['p50_ms']:.2f})")


def main() -> None:
    asyncio.run(main_async(C.stream_arguments(__doc__, clients=24, seconds=8.0).parse_args()))


if __name__ == "__main__":
    main()
