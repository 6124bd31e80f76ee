"""A scenario with `[server] engine = "sglang"`: served (a private `serve --engine sglang`)
and in virtual time it runs SGLang's profile, refuses a full queue with SGLang's 503 "The
request queue is full." once `max_queued_requests` wait, and its /metrics carries sglang:*
series and no vllm: ones."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inference_lab.experiments.oracle import deployment_for
from inference_lab.experiments.scenario import parse_scenario
from inference_lab.experiments.virtual import BASE_PORT, VirtualLab
import tomllib

ROOT = Path(__file__).resolve().parents[2]

# Poisson arrivals far beyond what max_num_seqs 2 drains; a fixed limit that never sheds,
# so every arrival reaches the server and the queue bound alone refuses.
SCENARIO = """
name = "sglang-overload"
duration = 3
server = {{ engine = "sglang", max_num_seqs = 2{bound} }}
controller = {{ name = "fixed", params = {{ limit = 100000 }} }}
[load]
arrival_pattern = "poisson"
arrival_rate = 150.0
input_len_dist = {{ type = "fixed", value = 16 }}
output_len_dist = {{ type = "fixed", value = 50 }}
"""
BOUNDED = SCENARIO.format(bound=", max_queued_requests = 2")
# The same overload behind AIMD (initial limit 20, floor 1): only a drop lowers its limit
# (every answer of max_tokens 50 comes well inside its 5 s timeout).
AIMD = BOUNDED.replace('name = "fixed", params = { limit = 100000 }',
                       'name = "aimd", params = { min_limit = 1 }')
# The overload plus injected 503s (the lab's "overloaded" fault, 60 % of requests for a
# modelled second): two kinds of 503 in one run, told apart by their error bodies.
FAULTED = BOUNDED + """
[[timeline]]
at = 1
fault = { kind = "errors", rate = 0.6, types = ["overloaded"], seed = 1, seconds = 1 }
"""


def experiment(tmp_path: Path, text: str, *mode: str) -> Path:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(text)
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-P", "-m", "inference_lab", "experiment",
                           str(scenario), *mode, "--out", str(out)],
                          capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def requests(out: Path) -> dict:
    return pq.read_table(out / "requests.parquet").to_pydict()


@pytest.mark.parametrize("mode", [("--virtual",), ("--serve", "--time-scale", "2")],
                         ids=["virtual", "served"])
def test_a_full_sglang_queue_is_refused_with_its_503_in_both_modes(tmp_path, mode):
    table = requests(experiment(tmp_path, BOUNDED, *mode))
    status = table["status"]
    assert status.count(503) > 10 and status.count(200) > 10
    assert 529 not in status
    refused = [e for s, e in zip(status, table["error"]) if s == 503]
    assert all('"The request queue is full."' in e and '"queue_saturated"' in e for e in refused)


@pytest.mark.parametrize("mode", [("--virtual",), ("--serve", "--time-scale", "2")],
                         ids=["virtual", "served"])
def test_the_summary_counts_sglangs_full_queue_503s_as_refusals_not_errors(tmp_path, mode):
    out = experiment(tmp_path, BOUNDED, *mode)
    summary = json.loads((out / "summary.json").read_text())
    table = requests(out)  # the requests sent within the run's duration, as the summary counts
    status = [s for s, t in zip(table["status"], table["send_s"]) if 0.0 <= t < summary["duration_s"]]
    whole = summary["phases"][0]["whole"]  # (the one phase: no timeline)
    assert whole["n_529"] == status.count(503) > 10
    assert summary["frac_529"] == pytest.approx(status.count(503) / summary["requests"])
    assert summary["errors"] == whole["errors"] == 0
    assert whole["refusal_rtt_p50_s"] is not None
    report = (out / "report.html").read_text()
    assert "refused (full queue), 0 other errors" in report


def test_aimd_lowers_its_limit_on_sglangs_full_queue_503s(tmp_path):
    out = experiment(tmp_path, AIMD, "--virtual")
    status = requests(out)["status"]
    limits = pq.read_table(out / "controller.parquet").to_pydict()["limit"]
    assert status.count(503) > 0 and status.count(200) > 10
    # from its initial 20 only a drop takes it down: the queue-full 503s are drops
    assert limits[0] == 20.0 and min(limits) < 10


def test_an_injected_503_stays_an_error_beside_the_full_queues_refusals(tmp_path):
    out = experiment(tmp_path, FAULTED, "--serve", "--time-scale", "2")
    table = requests(out)
    summary = json.loads((out / "summary.json").read_text())
    # the summary counts the requests sent within the run's duration (a served run's last
    # send may fall just after it)
    rows = [(s, e) for s, e, t in zip(table["status"], table["error"], table["send_s"])
            if 0.0 <= t < summary["duration_s"]]
    full = [s == 503 and '"The request queue is full."' in e for s, e in rows]
    injected = [s == 503 and "(injected fault)" in e for s, e in rows]
    assert sum(full) > 10 and sum(injected) > 0
    assert summary["frac_529"] * summary["requests"] == pytest.approx(sum(full))
    assert summary["errors"] == sum(injected)


@pytest.mark.parametrize("mode", [("--virtual",), ("--serve", "--time-scale", "2")],
                         ids=["virtual", "served"])
def test_the_queue_gauges_of_an_sglang_server_are_scraped(tmp_path, mode):
    # served: sglang:num_queue_reqs and sglang:num_running_reqs from the engine's /metrics,
    # the knobs (which SGLang's exposition lacks) from /control/capacity
    out = experiment(tmp_path, BOUNDED, *mode)
    server = pq.read_table(out / "server.parquet").to_pydict()
    assert len(server["t"]) >= 4
    for key in ("waiting", "running", "max_num_seqs", "max_waiting"):
        assert not any(math.isnan(v) for v in server[key]), key
    assert max(server["running"]) == 2 and max(server["waiting"]) == 2
    assert set(server["max_num_seqs"]) == {2.0} and set(server["max_waiting"]) == {2.0}


def test_keda_scales_an_sglang_fleet_on_its_queue_gauge(tmp_path):
    # 150 requests/s against max_num_seqs 2 per replica: sglang:num_queue_reqs summed over
    # the replicas stays far above the threshold, so KEDA adds replicas at every sync.
    text = BOUNDED.replace("duration = 3", "duration = 20\nscrape_interval = 1") + """
[fleet]
replicas = 1
max_replicas = 4
startup_delay = 1
metrics_interval = 1
[autoscaler]
name = "keda"
params = { query = "sum(sglang:num_queue_reqs)", threshold = 1, polling_interval = 2, sync_period = 2 }
"""
    out = experiment(tmp_path, text, "--virtual")
    scaling = pq.read_table(out / "scaling.parquet").to_pydict()
    assert scaling["to"] and max(scaling["to"]) == 4


def test_an_unbounded_sglang_queue_refuses_nothing_in_virtual_time(tmp_path):
    table = requests(experiment(tmp_path, SCENARIO.format(bound=""), "--virtual"))
    assert set(table["status"]) == {200} and len(table["status"]) > 10


def test_the_virtual_labs_metrics_carry_sglang_names_and_no_vllm_ones():
    scenario = parse_scenario(tomllib.loads(BOUNDED), "sglang.toml")
    dep = deployment_for(scenario)
    assert dep.scheduler.engine == "sglang" and dep.scheduler.max_waiting == 2
    loop = asyncio.new_event_loop()
    try:
        status, body = VirtualLab(loop, dep).request("GET", f"http://lab:{BASE_PORT}/metrics")
    finally:
        loop.close()
    assert status == 200
    names = {f.name for f in text_string_to_metric_families(body.decode())}
    assert {"sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage",
            "sglang:time_to_first_token_seconds"} <= names
    assert not [n for n in names if n.startswith("vllm:")]
