"""`inference-lab experiment` on a P/D fleet, end to end over real HTTP: a sweep of two
P:D ratios on 3 replicas, each on a private `serve --kv-roles`, the load generator
routing each request's prefill and decode as vllm-router's P/D mode does; per ratio every
request completes through both pools, the decode replicas count the prompts as received
by transfer, and the client's TTFT includes the prefill."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from scenario_text import closed_loop

ROOT = Path(__file__).resolve().parents[2]
PROMPT = 1500  # tokens: 24 blocks of 64, every position but the last received by transfer

SCENARIO = f"""
name = "pd-tiny"
duration = 2
model = "gpt-oss-20b"
window = 0.5
[server]
max_num_seqs = 64
[load]
arrival_pattern = "poisson"
arrival_rate = 12
input_len_dist = {{ type = "fixed", value = {PROMPT} }}
output_len_dist = {{ type = "fixed", value = 16 }}
seed = 3
[fleet]
replicas = 3
kv_roles = ["1:2", "2:1"]
startup_delay = 0
"""


def experiment(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "inference_lab", "experiment", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("pd")
    (where / "pd.toml").write_text(SCENARIO)
    out = where / "run"
    done = experiment(str(where / "pd.toml"), "--serve", "--time-scale", "2", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "P:D 1:2:" in done.stdout and "P:D 2:1:" in done.stdout
    return out


@pytest.mark.parametrize("ratio, prefill, decode", [("1:2", [0], [1, 2]), ("2:1", [0, 1], [2])])
def test_each_ratio_routes_every_request_through_both_pools(sweep, ratio, prefill, decode):
    run = sweep / f"pd-{ratio.replace(':', '-')}"
    req = {k: np.array(v) for k, v in pq.read_table(run / "requests.parquet").to_pydict().items()}
    n = len(req["status"])
    # 12 requests/s for 2 s: Poisson, so between a handful and a few dozen
    assert 5 <= n <= 60
    assert (req["status"] == 200).all(), req["error"]
    assert (req["completion_tokens"] == 16).all()
    assert set(req["prefill_replica"]) <= set(prefill) and set(req["replica"]) <= set(decode)
    # the decode replica received every prompt position but the last by transfer
    assert (req["cached_tokens"] == PROMPT - 1).all()
    # TTFT counts from the prefill's send: the prefill's round trip, then the decode
    # replica's own TTFT (its pull and the last position's step)
    assert (req["prefill_e2e_s"] > 0).all()
    assert (req["ttft_s"] > req["prefill_e2e_s"] + req["m_ttft_s"] - 1e-3).all()
    assert (req["ttft_s"] <= req["e2e_s"]).all()
    # the engines' own: the prefill replica's modelled e2e + the decode replica's TTFT,
    # which the client's TTFT (those plus the HTTP hops) never undercuts
    assert (req["prefill_m_e2e_s"] > 0).all() and (req["m_ttft_s"] > 0).all()
    assert (req["ttft_s"] > req["prefill_m_e2e_s"] + req["m_ttft_s"] - 1e-3).all()

    summary = json.loads((run / "summary.json").read_text())["pd"]
    assert (summary["kv_roles"], summary["prefill_replicas"], summary["decode_replicas"]) == \
        (ratio, prefill, decode)
    assert summary["requests"] == summary["completed"] == n and summary["failed"] == 0
    assert summary["recomputed"] == 0
    hits = {int(k): m["external_hits"] for k, m in summary["decode_metrics"].items()}
    assert set(hits) == set(decode) and sum(hits.values()) == n * (PROMPT - 1)
    used = set(req["replica"].tolist())
    assert all(hits[r] > 0 for r in used)
    assert summary["ttft_ms"]["p50"] > summary["prefill_ms"]["p50"] > 0
    assert summary["tpot_ms"]["p50"] >= 0 and summary["model_tpot_ms"]["p50"] > 0
    model = req["prefill_m_e2e_s"] + req["m_ttft_s"]
    assert summary["model_ttft_ms"]["p50"] == pytest.approx(np.percentile(model, 50) * 1000)


def test_the_sweep_page_tables_and_plots_every_ratio(sweep):
    summary = json.loads((sweep / "summary.json").read_text())
    assert [r["kv_roles"] for r in summary["pd_sweep"]] == ["1:2", "2:1"]
    assert summary["runs"] == ["pd-1-2", "pd-2-1"]
    page = (sweep / "report.html").read_text()
    assert page.count("<td class=l>1:2</td>") == 1 and page.count("<td class=l>2:1</td>") == 1
    assert "TTFT against TPOT per P:D ratio" in page and "data:image/png;base64," in page
    for d in summary["runs"]:
        assert "TTFT against TPOT" in (sweep / d / "report.html").read_text()


@pytest.mark.parametrize("args, message", [
    (["--virtual"], "fleet.kv_roles: virtual time does not model a P/D fleet"),
    (["--url", "http://127.0.0.1:9"], "fleet.kv_roles: a sweep of 3 P:D ratios needs --serve"),
])
def test_a_sweep_it_cannot_run_is_refused_naming_the_key(tmp_path, args, message):
    done = experiment("configs/experiments/pd-ratio.toml", *args, "--out", str(tmp_path / "x"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "x").exists()


CLOSED = closed_loop("pd-url", 1, 3, prompt=640, output=8, window=0.5) + """
[fleet]
kv_roles = "RATIO"
pd_policy = "round_robin"
startup_delay = 0
"""


def test_url_drives_a_running_pd_fleet_closed_loop_and_refuses_a_layout_it_does_not_have(tmp_path):
    from inference_lab.testing.launch import serve

    good, bad = tmp_path / "good.toml", tmp_path / "bad.toml"
    good.write_text(CLOSED.replace("RATIO", "1:2"))
    bad.write_text(CLOSED.replace("RATIO", "2:1"))
    with serve("--replicas", "3", "--kv-roles", "1:2", ports=3) as served:
        done = experiment(str(good), "--url", served.base, "--out", str(tmp_path / "good"))
        refused = experiment(str(bad), "--url", served.base, "--out", str(tmp_path / "bad"))
    assert done.returncode == 0, done.stdout + done.stderr
    req = pq.read_table(tmp_path / "good" / "requests.parquet").to_pydict()
    n = len(req["status"])
    assert n >= 6 and set(req["status"]) == {200} and set(req["cached_tokens"]) == {639}
    assert set(req["prefill_replica"]) == {0}
    # round robin over the decode pool: its two replicas take turns
    assert set(req["replica"]) == {1, 2} and abs(req["replica"].count(1) - req["replica"].count(2)) <= 3
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert ('fleet.kv_roles = "2:1": the server at' in refused.stderr
            and "has 1 prefill (kv_producer) and 2 decode (kv_consumer) replicas ready" in refused.stderr)
    assert "Traceback" not in refused.stderr
