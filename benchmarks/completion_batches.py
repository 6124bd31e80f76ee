"""Several prompts in one completions request, against as many requests of one prompt.

    python benchmarks/completion_batches.py [--prompts 256] [--rounds 20]
                                            [--prompt-bytes 400] [--max-tokens 16] [--json FILE]

Starts `inference-lab serve` (gpt-oss-20b on a modelled B200) and sends, alternately,
`--rounds` times each: one non-streamed completions request whose `prompt` lists
`--prompts` prompts (as lm-evaluation-harness's local-completions sends them), and the
same prompts as that many concurrent requests of one prompt (aiohttp, a connection each).
Prints for each form: the client's wall time per round (median), the gateway's and the
engine's CPU per prompt (summed over the rounds: /proc counts in 10 ms ticks), and the
modelled TTFT of the prompts (median over rounds of the
round's least and greatest, from the responses' `inference_lab`: prompts that reach the
engine together share a prefill step). Prints figures, no pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import aiohttp

import _common as C

MODEL = "gpt-oss-20b"


def prompts(count: int, size: int) -> list[str]:
    """Distinct prompts (no shared prefix past the first bytes) of `size` bytes each."""
    return [(f"{i:06d} " + "lorem ipsum " * size)[:size] for i in range(count)]


async def batched(session: aiohttp.ClientSession, url: str, texts: list[str],
                  max_tokens: int) -> list[float]:
    async with session.post(url, json={"model": MODEL, "prompt": texts,
                                       "max_tokens": max_tokens}) as resp:
        body = await resp.json()
        assert resp.status == 200, body
    assert [c["index"] for c in body["choices"]] == list(range(len(texts)))
    return [m["ttft_s"] for m in body["inference_lab"]["prompts"]]


async def one_each(session: aiohttp.ClientSession, url: str, texts: list[str],
                   max_tokens: int) -> list[float]:
    async def one(text: str) -> float:
        async with session.post(url, json={"model": MODEL, "prompt": text,
                                           "max_tokens": max_tokens}) as resp:
            body = await resp.json()
            assert resp.status == 200, body
        return body["inference_lab"]["ttft_s"]
    return list(await asyncio.gather(*(one(t) for t in texts)))


async def run(served: C.Served, args) -> dict:
    url = served.base + "/v1/completions"
    texts = prompts(args.prompts, args.prompt_bytes)
    pids = {"gateway": [served.gateway_pid], "engine": [served.engine_pid]}
    forms = {"one request of N prompts": batched, "N requests of one prompt": one_each}
    results: dict[str, dict[str, list[float]]] = {
        name: {"wall": [], "gateway": [], "engine": [], "ttft_min": [], "ttft_max": []}
        for name in forms}
    connector = aiohttp.TCPConnector(limit=args.prompts)
    async with aiohttp.ClientSession(connector=connector) as session:
        for form in forms.values():  # warm up: connections, the model cache
            await form(session, url, texts, args.max_tokens)
        for _ in range(args.rounds):
            for name, form in forms.items():
                before = C.cpu_snapshot(pids)
                start = time.perf_counter()
                ttfts = await form(session, url, texts, args.max_tokens)
                wall = time.perf_counter() - start
                after = C.cpu_snapshot(pids)
                r = results[name]
                r["wall"].append(wall)
                for group in ("gateway", "engine"):
                    r[group].append(after[group] - before[group])
                r["ttft_min"].append(min(ttfts))
                r["ttft_max"].append(max(ttfts))
    print(f"{args.prompts} prompts of {args.prompt_bytes} bytes, max_tokens {args.max_tokens}, "
          f"{args.rounds} rounds of each form, alternated")
    print(f"{'form':<28} {'wall ms':>8} {'gw CPU us/prompt':>17} {'engine CPU us/prompt':>21} "
          f"{'modelled TTFT ms (least, greatest)':>36}")
    count = args.prompts * args.rounds
    med = statistics.median
    out = {name: {"wall_ms": med(r["wall"]) * 1e3,
                  "gateway_us_per_prompt": sum(r["gateway"]) / count * 1e6,
                  "engine_us_per_prompt": sum(r["engine"]) / count * 1e6,
                  "ttft_least_ms": med(r["ttft_min"]) * 1e3,
                  "ttft_greatest_ms": med(r["ttft_max"]) * 1e3}
           for name, r in results.items()}
    for name, f in out.items():
        print(f"{name:<28} {f['wall_ms']:8.1f} {f['gateway_us_per_prompt']:17.0f} "
              f"{f['engine_us_per_prompt']:21.0f} {f['ttft_least_ms']:17.2f}, "
              f"{f['ttft_greatest_ms']:.2f}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--prompt-bytes", type=int, default=400)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    print(C.machine())
    C.print_load("the run")
    with C.serve() as served:
        forms = asyncio.run(run(served, args))
    C.write_json(args.json, {"prompts": args.prompts, "rounds": args.rounds, "forms": forms})


if __name__ == "__main__":
    main()
