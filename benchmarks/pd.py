"""P/D disaggregation behind vllm-router: what the decode replica receives by transfer, and
the client's TTFT against the model.

Starts `serve --replicas 2 --kv-roles 1:1` (replica 0 prefill, replica 1 decode) and
vllm-router in front (`--vllm-pd-disaggregation --kv-connector nixl`), then sends
`--requests` streaming chat requests of `--prompt-tokens` tokens one at a time. Per
request, from the replicas' /metrics: the decode replica's external prefix cache hits
(tokens received by transfer) and recomputed requests, the prefill replica's modelled
time (its e2e latency) and the decode replica's modelled pull and TTFT. The client's TTFT
(first content chunk through the router, wall clock x --time-scale: modelled seconds) is
compared with prefill time + transfer, and with prefill time + the decode side's whole
TTFT (its request overhead, the pull and the step computing the last prompt position).

    python benchmarks/pd.py [--requests 10] [--prompt-tokens 1500] [--time-scale 0.02] [--link rdma]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp  # noqa: E402

from inference_lab.testing.launch import serve  # noqa: E402
from inference_lab.testing.routers import MODEL, metric, pd_router, system_prompt  # noqa: E402

SERIES = {  # (replica, name, labels)
    "hits": (1, "vllm:external_prefix_cache_hits_total", {}),
    "queries": (1, "vllm:external_prefix_cache_queries_total", {}),
    "recomputed": (1, "inference_lab_kv_transfer_recomputed_total", {}),
    "transfer": (1, "inference_lab_kv_transfer_seconds_sum", {}),
    "decode_ttft": (1, "vllm:time_to_first_token_seconds_sum", {}),
    "prefill_e2e": (0, "vllm:e2e_request_latency_seconds_sum", {}),
}


async def scrape(http, urls) -> dict[str, float]:
    return {key: await metric(http, urls[r] + "/metrics", name, **labels)
            for key, (r, name, labels) in SERIES.items()}


async def one(http, router: str, content: str) -> tuple[float, int]:
    """(wall seconds to the first content chunk, prompt tokens) of one streamed chat."""
    body = {"model": MODEL, "max_tokens": 16, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": content}]}
    start = time.monotonic()
    ttft, prompt = None, 0
    async with http.post(router + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if ttft is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                ttft = time.monotonic() - start
            if chunk.get("usage"):
                prompt = chunk["usage"]["prompt_tokens"]
    return ttft, prompt


async def run(args) -> dict:
    with serve("--replicas", "2", "--kv-roles", "1:1", "--kv-link", args.link,
               "--time-scale", str(args.time_scale), ports=2) as served:
        urls = [f"http://127.0.0.1:{served.port + i}" for i in range(2)]
        with pd_router(urls[:1], urls[1:]) as router:
            rows = []
            async with aiohttp.ClientSession() as http:
                url = f"http://127.0.0.1:{router.port}"
                await one(http, url, system_prompt(999, 100))  # warm the path
                for i in range(args.requests):
                    before = await scrape(http, urls)
                    ttft, prompt = await one(http, url, system_prompt(i, args.prompt_tokens - 6))
                    await asyncio.sleep(0.2)  # the replicas' metrics copies catch up
                    after = await scrape(http, urls)
                    d = {k: after[k] - before[k] for k in after}
                    rows.append({"prompt": prompt, "ttft": ttft * args.time_scale, **d})
            log = router.log()
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    model = med["prefill_e2e"] + med["transfer"]
    whole = med["prefill_e2e"] + med["decode_ttft"]
    return {
        "requests": len(rows), "prompt_tokens": med["prompt"],
        "external_hit_share": sum(r["hits"] for r in rows) / sum(r["prompt"] for r in rows),
        "recomputed": sum(r["recomputed"] for r in rows),
        "router_warned": "No kv_transfer_params" in log,
        "prefill_modelled_s": med["prefill_e2e"], "transfer_modelled_s": med["transfer"],
        "decode_ttft_modelled_s": med["decode_ttft"],
        "client_ttft_s": med["ttft"],
        "ttft_vs_prefill_plus_transfer": med["ttft"] / model - 1,
        "ttft_vs_prefill_plus_decode_ttft": med["ttft"] / whole - 1,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=10)
    p.add_argument("--prompt-tokens", type=int, default=1500)
    p.add_argument("--time-scale", type=float, default=0.02,
                   help="modelled seconds per wall second (below 1: the HTTP hops weigh less)")
    p.add_argument("--link", default="rdma")
    args = p.parse_args()
    result = asyncio.run(run(args))
    for key, value in result.items():
        print(f"{key:36} {value:.6g}" if isinstance(value, float) else f"{key:36} {value}")


if __name__ == "__main__":
    main()
