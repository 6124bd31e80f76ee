"""The reference experiment read the way an autoscaler or a dashboard reads it: a real
Prometheus scrapes a real `serve`'s API port while 24 clients each run two 200-token
requests side by side (gpt-oss-20b on a modelled B200: ~293 ms each), and PromQL's
histogram_quantile of p50 and p99 lands within 5 % of the exact values: the modelled TTFT
and e2e every response reports, and for the inter-token gaps (which no response lists) the
bucket that holds the exact quantile, no wider than 5 %, and their exact sum."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import urllib.parse
import urllib.request

import aiohttp
import pytest

from inference_lab.common.ports import free_port
from inference_lab.testing.launch import serve
from inference_lab.testing.poll import wait_until
from system_tools import tool

pytestmark = pytest.mark.tools("prometheus")
MODEL = "gpt-oss-20b"
CLIENTS, ROUNDS, TOKENS = 24, 2, 200


def query(base: str, expr: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]["result"]


def value(base: str, expr: str) -> float | None:
    result = query(base, expr)
    return float(result[0]["value"][1]) if result else None


def exact(values: list[float], q: float) -> float:
    """The nearest-rank quantile: the smallest value with at least q of them at or below."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A fresh serve (nothing observed yet) and a Prometheus scraping its API port."""
    work = tmp_path_factory.mktemp("prometheus")
    with serve() as served:
        port = free_port()
        target = served.base.removeprefix("http://")
        (work / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 250ms\n  scrape_timeout: 250ms\n"
            f"scrape_configs:\n  - job_name: lab\n    static_configs:\n"
            f"      - targets: [\"{target}\"]\n")
        proc = subprocess.Popen(
            [tool("prometheus"), f"--config.file={work / 'prometheus.yml'}",
             f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: value_or_none(base, 'up{job="lab"}') == 1.0, timeout=45,
                       interval=0.2, what="Prometheus scraping the lab")
            yield served, base
        finally:
            proc.terminate()
            proc.wait(timeout=15)


def value_or_none(base: str, expr: str) -> float | None:
    try:
        return value(base, expr)
    except (OSError, ValueError):
        return None


async def run_rounds(url: str) -> list[dict]:
    """CLIENTS requests at once, ROUNDS times; every response's modelled timings."""
    body = {"model": MODEL, "max_tokens": TOKENS,
            "messages": [{"role": "user", "content": "Tell me a story."}]}
    timings = []
    async with aiohttp.ClientSession() as session:
        async def one() -> dict:
            async with session.post(url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                reply = await resp.json()
                assert reply["usage"]["completion_tokens"] == TOKENS
                return reply["inference_lab"]
        for _ in range(ROUNDS):
            timings += await asyncio.gather(*(one() for _ in range(CLIENTS)))
    return timings


def test_histogram_quantile_of_the_reference_experiment_is_within_5_percent(lab):
    served, prom = lab
    timings = asyncio.run(run_rounds(served.base))
    n = CLIENTS * ROUNDS
    count = f'sum(vllm:e2e_request_latency_seconds_count{{model_name="{MODEL}"}})'
    wait_until(lambda: value(prom, count) == n, timeout=20, interval=0.2,
               what=f"a scrape that has seen all {n} finishes")
    report = {}
    for series, key in (("vllm:e2e_request_latency_seconds", "e2e_s"),
                        ("vllm:time_to_first_token_seconds", "ttft_s")):
        values = [t[key] for t in timings]
        for q in (0.5, 0.99):
            got = value(prom, f"histogram_quantile({q}, sum by (le) ({series}_bucket))")
            want = exact(values, q)
            report[f"{key} p{int(q * 100)}"] = (round(got * 1e3, 3), round(want * 1e3, 3))
            assert abs(got - want) <= 0.05 * want, report
    # The inter-token gaps: the estimate lies in the bucket that holds the exact quantile
    # (its rank), and that bucket is at most 5 % wide; the histogram's sum is the responses'
    # exact total of gaps (each response's e2e less its TTFT).
    itl = "vllm:inter_token_latency_seconds"
    buckets = sorted((float(r["metric"]["le"]), float(r["value"][1]))
                     for r in query(prom, f"sum by (le) ({itl}_bucket)"))
    total = buckets[-1][1]
    assert total == n * (TOKENS - 1)
    mean = value(prom, f"sum({itl}_sum)") / total
    exact_mean = sum(t["e2e_s"] - t["ttft_s"] for t in timings) / total
    assert abs(mean - exact_mean) <= 0.01 * exact_mean, (mean, exact_mean)
    estimates = []
    for q in (0.5, 0.99):
        got = value(prom, f"histogram_quantile({q}, sum by (le) ({itl}_bucket))")
        rank = q * total
        i = next(i for i, (_, c) in enumerate(buckets) if c >= rank)
        lo, hi = buckets[i - 1][0], buckets[i][0]
        report[f"itl p{int(q * 100)}"] = (round(got * 1e3, 4), f"in ({lo * 1e3:.4f}, {hi * 1e3:.4f}]")
        assert lo <= got <= hi and hi <= 1.05 * lo, report
        estimates.append(got)
    assert estimates[0] <= estimates[1], report
    print("PromQL (ms) vs exact:", report, "ITL mean", round(mean * 1e3, 4))
    assert 0.27 < exact([t["e2e_s"] for t in timings], 0.5) < 0.32  # the reference's ~293 ms
