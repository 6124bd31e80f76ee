"""vllm-router (PyPI `vllm-router`, vllm-project's Rust router) as a process in front of
the lab's replicas, and the workloads its policies are judged by, for tests and
benchmarks alike.

Knows: where its command is (beside this interpreter, as pip installs it), the flags that
keep it quick and private on a loopback port (its own Prometheus exporter on a free port,
a 1 s worker check interval, which is also how often power_of_two polls GET /get_load),
when it is ready (GET /readiness answers 200: at least one worker healthy) and how it is
stopped (by its pid: it renames its process `vllm::router`). The workloads, bounded in
count and time: requests through the router, where each was served (the replica header
the router passes on), a replica loaded from outside by long streams (`loaded_replica`),
groups of requests sharing long system prompts (`prefix_groups`) with the fleet's
prefix-cache hit rate from the replicas' own vLLM counters. Does not know the policies.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import sys
from collections.abc import AsyncIterator, Iterator

import aiohttp

from inference_lab.common.ports import free_port
from inference_lab.testing.launch import Proc
from inference_lab.testing.poll import until

MODEL = "gpt-oss-20b"


def router_command() -> str | None:
    """The `vllm-router` command installed beside this interpreter (or on PATH)."""
    beside = os.path.join(os.path.dirname(sys.executable), "vllm-router")
    return beside if os.path.exists(beside) else shutil.which("vllm-router")


@contextlib.contextmanager
def vllm_router(workers: list[str], policy: str, *extra: str,
                timeout: float = 60.0) -> Iterator[Proc]:
    """vllm-router on a free 127.0.0.1 port in front of `workers` (base URLs) with
    `policy`; `.port` is its port once it is ready. Stopped (SIGKILL by pid) afterwards."""
    with _running(["--policy", policy, "--worker-urls", *workers], extra, timeout) as proc:
        yield proc


@contextlib.contextmanager
def pd_router(prefill: list[str], decode: list[str], *extra: str,
              timeout: float = 60.0) -> Iterator[Proc]:
    """vllm-router in its P/D mode (`--vllm-pd-disaggregation`, NixlConnector's
    kv_transfer_params) on a free 127.0.0.1 port: each request's prefill on a `prefill`
    worker, its decode on a `decode` worker. `.port` once ready; stopped afterwards."""
    argv = ["--vllm-pd-disaggregation", "--kv-connector", "nixl", "--policy", "round_robin"]
    for url in prefill:
        argv += ["--prefill", url]
    for url in decode:
        argv += ["--decode", url]
    with _running(argv, extra, timeout) as proc:
        yield proc


@contextlib.contextmanager
def _running(args: list[str], extra: tuple[str, ...], timeout: float) -> Iterator[Proc]:
    """vllm-router with `args` on a free 127.0.0.1 port (its Prometheus on another), ready;
    `extra` last, so that it overrides the defaults (--log-level)."""
    binary = router_command()
    if binary is None:
        raise RuntimeError("vllm-router is not installed: pip install vllm-router")
    port = free_port()
    proc = Proc([binary, "--host", "127.0.0.1", "--port", str(port), *args,
                 "--prometheus-port", str(free_port()), "--worker-startup-check-interval", "1",
                 "--log-level", "info", *extra], env={"NO_COLOR": "1", "RUST_LOG_STYLE": "never"})
    try:
        proc.port = port
        proc.wait_http_ok(f"http://127.0.0.1:{port}/readiness", timeout)
        yield proc
    finally:
        proc.close()


# ---- workloads ---------------------------------------------------------------------------


async def metric(http: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float:
    """The sum of a series' samples at `url` (a /metrics) whose labels include `labels`."""
    async with http.get(url) as resp:
        text = await resp.text()
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") and all(w in line for w in wanted))


async def get_load(http: aiohttp.ClientSession, replica: str) -> int:
    async with http.get(replica + "/get_load") as resp:
        return (await resp.json())["load"]


@contextlib.asynccontextmanager
async def held_streams(http: aiohttp.ClientSession, url: str, n: int) -> AsyncIterator[None]:
    """`n` streaming completions without end in sight on `url`, each past its first chunk
    (running) while inside; closed on the way out (the lab cancels them)."""
    opened: list[aiohttp.ClientResponse] = []
    try:
        for _ in range(n):
            resp = await http.post(url + "/v1/completions", json={
                "model": MODEL, "prompt": "Tell me a long story.", "max_tokens": 100_000,
                "stream": True})
            opened.append(resp)
            assert resp.status == 200, await resp.text()
            await resp.content.readline()
        yield
    finally:
        for resp in opened:
            resp.close()


async def through(http: aiohttp.ClientSession, router: str, bodies: list[dict],
                  at_once: int, path: str = "/v1/chat/completions") -> list[aiohttp.ClientResponse]:
    """Every body POSTed to the router, `at_once` in flight, in order; each response read
    whole (its headers and JSON body kept on it as `.body`)."""
    gate = asyncio.Semaphore(at_once)

    async def one(body: dict) -> aiohttp.ClientResponse:
        async with gate:
            async with http.post(router + path, json=body) as resp:
                resp.body = await resp.read()
                return resp

    return list(await asyncio.gather(*(one(b) for b in bodies)))


def replica_of(resp: aiohttp.ClientResponse) -> str | None:
    return resp.headers.get("x-inference-lab-replica")


async def loaded_replica(http: aiohttp.ClientSession, replicas: list[str], router: str,
                         streams: int = 8, routed: int = 24, at_once: int = 6,
                         max_tokens: int = 64) -> list[str | None]:
    """`streams` endless streams sent straight to replicas[0] (not through the router);
    once the router has taken a round of GET /get_load polls that showed them, `routed`
    chat requests through the router, `at_once` at a time. Where each was served."""
    polls = replicas[0] + "/metrics"
    async with held_streams(http, replicas[0], streams):
        await until(lambda: _load_at_least(http, replicas[0], streams), timeout=30,
                    what=f"{streams} streams running on replica 0")
        seen = await metric(http, polls, "inference_lab_gateway_http_requests_total",
                            route="/get_load")
        # The router polls every worker in turn, then takes the round's loads: the first
        # poll answered from here on saw the streams, and the one after it starts the next
        # round, once that round's loads are taken.
        await until(lambda: _polled_since(http, polls, seen + 1), timeout=30, interval=0.05,
                    what="two more GET /get_load of replica 0 by the router")
        bodies = [{"model": MODEL, "max_tokens": max_tokens,
                   "messages": [{"role": "user", "content": f"question {i}"}]}
                  for i in range(routed)]
        served = await through(http, router, bodies, at_once)
    assert all(resp.status == 200 for resp in served), [resp.status for resp in served]
    return [replica_of(resp) for resp in served]


async def _load_at_least(http, replica: str, n: int) -> bool:
    return await get_load(http, replica) >= n


async def _polled_since(http, url: str, seen: float) -> bool:
    return await metric(http, url, "inference_lab_gateway_http_requests_total",
                        route="/get_load") > seen


def system_prompt(group: int, tokens: int) -> str:
    """A system prompt of about `tokens` tokens under the built-in tokenizer (4 bytes a
    token), the same for every request of `group`, unlike any other group's from its
    first block."""
    words = f"[group {group}] Follow the house style of group {group} in every answer. "
    return (words * (4 * tokens // len(words) + 1))[:4 * tokens]


async def prefix_groups(http: aiohttp.ClientSession, replicas: list[str], router: str,
                        groups: int = 3, per_group: int = 8, at_once: int = 6,
                        system_tokens: int = 1500, max_tokens: int = 32,
                        seed: int = 0) -> tuple[dict[int, list[str | None]], float]:
    """`groups` x `per_group` chat requests through the router, `at_once` at a time, each
    group's sharing a system prompt of about `system_tokens` tokens (the order shuffled
    with `seed`). Returns where each group's requests were served, in order, and the
    fleet's prefix-cache hit rate over them (vLLM's counters, summed over the replicas:
    hits / queries, in tokens)."""
    jobs = [(g, i) for g in range(groups) for i in range(per_group)]
    random.Random(seed).shuffle(jobs)
    bodies = [{"model": MODEL, "max_tokens": max_tokens, "messages": [
        {"role": "system", "content": system_prompt(g, system_tokens)},
        {"role": "user", "content": f"Question {i} of group {g}?"}]} for g, i in jobs]
    counters = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")

    async def totals() -> list[float]:
        return [sum([await metric(http, r + "/metrics", name) for r in replicas])
                for name in counters]

    before = await totals()
    served = await through(http, router, bodies, at_once)
    assert all(resp.status == 200 for resp in served), [resp.status for resp in served]
    placements: dict[int, list[str | None]] = {g: [] for g in range(groups)}
    for (g, _), resp in zip(jobs, served):
        placements[g].append(replica_of(resp))
    # read-your-finishes: a replica's /metrics after a finish it served counts it
    hits, queries = [a - b for a, b in zip(await totals(), before)]
    return placements, hits / queries if queries else 0.0
