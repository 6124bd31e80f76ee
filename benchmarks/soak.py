"""Soak: the real `inference-lab serve` held at saturation, watched for leaks.

Starts `serve` (gateway in its process, engine as its child) on free loopback ports, caps
the model (`max_num_seqs`, `max_waiting`) so that the queue is full and later arrivals get
529, and runs `clients` closed-loop streaming clients for `duration` seconds; a share of
them hang up early, mid-stream. Prints, for each process, RSS at start, after the warm-up
and at the end, and the growth over the measured part; the engine's waiting and running
once the clients stop; and whether every completed stream carried exactly its token count
(token frames and the usage frame, both equal to max_tokens). No pass/fail here: the
short version in tests/e2e/test_hardening_soak.py asserts.

    python benchmarks/soak.py [--duration 60] [--warmup 10] [--clients 48] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field

import _common as C
import aiohttp

MODEL = "gpt-oss-20b"
TOKEN_FRAME = b'"content":" token"'  # the gateway's pre-encoded chat token chunk
USAGE_MARK = b'"usage":{'


@dataclass
class Config:
    duration: float = 60.0  # seconds of load, warm-up included
    warmup: float = 10.0  # seconds before the "after warm-up" RSS sample
    clients: int = 48
    max_num_seqs: int = 16
    max_waiting: int = 16
    min_tokens: int = 16
    max_tokens: int = 400
    disconnect_share: float = 0.2  # clients that hang up mid-stream, per request
    backoff_s: float = 0.05  # after a 529
    seed: int = 1


@dataclass
class Counts:
    started: int = 0
    completed: int = 0
    exact: int = 0
    mismatched: int = 0
    disconnected: int = 0
    refused_529: int = 0
    errors: int = 0
    tokens: int = 0
    mismatches: list = field(default_factory=list)


# ---- processes ---------------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def rss_of(served: C.Served) -> dict[str, float]:
    return {"gateway (serve)": rss_mib(served.gateway_pid), "engine": rss_mib(served.engine_pid)}


# ---- load ------------------------------------------------------------------------------------


async def one_request(http: aiohttp.ClientSession, base: str, rng: random.Random, cfg: Config,
                      counts: Counts) -> None:
    n = rng.randint(cfg.min_tokens, cfg.max_tokens)
    hang_up_after = rng.randint(1, max(1, n // 2)) if rng.random() < cfg.disconnect_share else 0
    body = {"model": MODEL, "messages": [{"role": "user", "content": "soak"}], "max_tokens": n,
            "stream": True, "stream_options": {"include_usage": True}}
    counts.started += 1
    async with http.post(base + "/v1/chat/completions", json=body) as resp:
        if resp.status == 529:
            counts.refused_529 += 1
            await resp.read()
            await asyncio.sleep(cfg.backoff_s)
            return
        if resp.status != 200:
            counts.errors += 1
            await resp.read()
            return
        tokens = 0
        tail = b""  # the last bytes received: a frame split across reads is counted once
        async for chunk in resp.content.iter_any():
            data = tail[-(len(TOKEN_FRAME) - 1):] + chunk
            tokens += data.count(TOKEN_FRAME)
            tail = (tail + chunk)[-4096:]
            if hang_up_after and tokens >= hang_up_after:
                counts.disconnected += 1
                counts.tokens += tokens
                resp.close()  # hang up mid-stream
                return
    counts.tokens += tokens
    usage = None
    i = tail.rfind(USAGE_MARK)
    if i >= 0:
        usage, _ = json.JSONDecoder().raw_decode(tail[i + len(USAGE_MARK) - 1:].decode())
    done = tail.endswith(b"data: [DONE]\n\n")
    counts.completed += 1
    if done and usage is not None and tokens == n == usage["completion_tokens"]:
        counts.exact += 1
    else:
        counts.mismatched += 1
        if len(counts.mismatches) < 10:
            counts.mismatches.append({"max_tokens": n, "token_frames": tokens, "usage": usage,
                                      "done": done})


async def client(http, base, rng, cfg, counts, stop_at: float) -> None:
    while time.monotonic() < stop_at:
        try:
            await one_request(http, base, rng, cfg, counts)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            counts.errors += 1


async def capacity(http: aiohttp.ClientSession, base: str) -> dict:
    async with http.get(base + "/control/capacity") as resp:
        return (await resp.json())[0]


async def sample(http: aiohttp.ClientSession, base: str, samples: list, stop_at: float) -> None:
    """The engine's queue and batch, four times a second while the load runs."""
    while time.monotonic() < stop_at:
        samples.append(await capacity(http, base))
        await asyncio.sleep(0.25)


async def drive(serve: C.Served, cfg: Config) -> dict:
    rng = random.Random(cfg.seed)
    counts = Counts()
    rss: dict[str, dict[str, float]] = {"start": rss_of(serve)}
    timeout = aiohttp.ClientTimeout(total=None, sock_read=30)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=timeout) as http:
        async with http.post(serve.base + "/control/capacity", json={
                "max_num_seqs": cfg.max_num_seqs, "max_waiting": cfg.max_waiting}) as resp:
            assert resp.status == 200, await resp.text()
        started = time.monotonic()
        stop_at = started + cfg.duration
        tasks = [asyncio.create_task(client(http, serve.base, random.Random(rng.random()), cfg,
                                            counts, stop_at)) for _ in range(cfg.clients)]
        samples: list[dict] = []
        sampler = asyncio.create_task(sample(http, serve.base, samples, stop_at))
        await asyncio.sleep(cfg.warmup)
        rss["after warm-up"] = rss_of(serve)
        tokens_at_warm = counts.tokens
        await asyncio.wait_for(asyncio.gather(*tasks), cfg.duration + 60)
        await sampler
        measured_s = time.monotonic() - started - cfg.warmup
        after = await capacity(http, serve.base)
        deadline = time.monotonic() + 10  # cancels of hung-up streams land asynchronously
        while (after["waiting"], after["running"]) != (0, 0) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            after = await capacity(http, serve.base)
        rss["end"] = rss_of(serve)
    growth = {name: 100.0 * (rss["end"][name] - rss["after warm-up"][name]) / rss["after warm-up"][name]
              for name in rss["end"]}
    return {
        "config": asdict(cfg),
        "rss_mib": rss,
        "rss_growth_after_warmup_pct": growth,
        "during_load": {f"{stat}_{key}": fn([row[key] for row in samples])
                        for key in ("waiting", "running")
                        for stat, fn in (("max", max), ("mean", statistics.fmean))},
        "after": {"waiting": after["waiting"], "running": after["running"]},
        "counts": asdict(counts),
        "tokens_per_s_after_warmup": (counts.tokens - tokens_at_warm) / measured_s if measured_s > 0 else 0.0,
    }


def run_soak(cfg: Config) -> dict:
    with C.serve(grace=2.0) as served:
        result = asyncio.run(drive(served, cfg))
    result["serve_exit_status"] = served.exit_status
    return result


def report(result: dict) -> str:
    cfg, c = result["config"], result["counts"]
    lines = [
        f"soak: {cfg['duration']:.0f} s ({cfg['warmup']:.0f} s warm-up), {cfg['clients']} streaming "
        f"clients, max_num_seqs={cfg['max_num_seqs']} max_waiting={cfg['max_waiting']}, "
        f"{cfg['disconnect_share']:.0%} hang up early",
        "  during load (4 samples/s): waiting max {max_waiting} mean {mean_waiting:.1f}, running max "
        "{max_running} mean {mean_running:.1f}".format(**result["during_load"]),
        "  RSS (MiB)            start   after warm-up     end   growth after warm-up",
    ]
    for name in result["rss_mib"]["start"]:
        r = {k: v[name] for k, v in result["rss_mib"].items()}
        lines.append(f"    {name:<17} {r['start']:7.1f}   {r['after warm-up']:13.1f} {r['end']:7.1f}"
                     f"   {result['rss_growth_after_warmup_pct'][name]:+6.2f} %")
    lines += [
        f"  requests: {c['started']} started, {c['completed']} completed, {c['disconnected']} hung up "
        f"early, {c['refused_529']} refused with 529, {c['errors']} errors",
        f"  exact token counts: {c['exact']} of {c['completed']} completed streams"
        + (f" ({c['mismatched']} wrong: {c['mismatches']})" if c["mismatched"] else ""),
        f"  tokens delivered after warm-up: {result['tokens_per_s_after_warmup']:.0f}/s",
        f"  after the clients stopped: waiting={result['after']['waiting']} "
        f"running={result['after']['running']}; serve exited with {result['serve_exit_status']}",
    ]
    return "\n".join(lines)


def main() -> None:
    defaults = Config()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, value in asdict(defaults).items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = vars(parser.parse_args())
    out = args.pop("json")
    result = run_soak(Config(**args))
    print(report(result))
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
