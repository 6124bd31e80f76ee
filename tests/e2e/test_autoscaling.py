"""Autoscaling experiments end to end: the real `inference-lab experiment` command with a
private `serve` of several replicas, a trace replayed request by request, the HPA scaling
the fleet through POST /control/replicas, requests routed to every ready replica; the
same scenario in virtual time agreeing with it; and the command's refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from inference_lab.common.traces import load_trace

ROOT = Path(__file__).resolve().parents[2]
TRACE_SCENARIO = ROOT / "configs" / "experiments" / "autoscaling-trace.toml"


def experiment(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "inference_lab", "experiment", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def table(out: Path, name: str) -> dict:
    return {k: np.array(v) for k, v in pq.read_table(out / f"{name}.parquet").to_pydict().items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The trace scenario served (at 2x the wall) and in virtual time."""
    base = tmp_path_factory.mktemp("autoscaling")
    served = experiment(str(TRACE_SCENARIO), "--serve", "--time-scale", "2", "--out", str(base / "served"))
    assert served.returncode == 0, served.stdout + served.stderr
    virtual = experiment(str(TRACE_SCENARIO), "--virtual", "--out", str(base / "virtual"))
    assert virtual.returncode == 0, virtual.stdout + virtual.stderr
    return base / "served", base / "virtual", served.stdout, virtual.stdout


def test_a_served_fleet_replays_every_trace_request_at_its_time_across_replicas(runs):
    served, _, stdout, _ = runs
    req = table(served, "requests")
    trace = load_trace(ROOT / "configs" / "traces" / "burstgpt-sample.csv", "burstgpt", speed=4)
    expected = sorted(t for t in trace.times if t < 16)
    assert len(req["due_s"]) == len(expected)  # every request of the trace, once
    assert np.allclose(np.sort(req["due_s"]), expected, atol=1e-6)
    assert set(req["status"]) <= {200, 529, 503} and (req["status"] == 200).mean() > 0.5
    assert len(set(req["replica"][req["status"] == 200])) > 1  # routed to several replicas
    ok = req["status"] == 200
    assert set(req["completion_tokens"][ok]) <= set(trace.outputs) and \
        req["completion_tokens"][ok].sum() > 0
    assert "SLO attainment" in stdout and "cost vs oracle" in stdout


def test_the_hpa_scaled_the_served_fleet_through_control_replicas(runs):
    served, _, _, _ = runs
    scaling, fleet = table(served, "scaling"), table(served, "fleet")
    assert scaling["to"].size >= 1 and scaling["to"].max() > 1  # scaled up from 1
    assert fleet["ready"].max() > 1  # ... and the new replicas became ready
    summary = json.loads((served / "summary.json").read_text())
    auto = summary["autoscaling"]
    assert auto["cold_starts"] == int(scaling["added"].sum()) >= 1
    assert auto["gpus_per_replica"] == 4  # llama-3.1-70b on h100: tp 4
    assert auto["gpu_hours"] == pytest.approx(auto["replica_seconds"] * 4 / 3600)


def crossed(other: dict, t: float, before: int, after: int, within: float) -> bool:
    """Whether `other`'s replica count (its scaling table) went as far as `after` from
    `before` (as high on a scale-up, as low on a scale-down) at some time in [t - within,
    t + within]: the replica timelines agree there within `within`, though one run may
    have taken two decisions where the other took one."""
    counts, at = [], int(other["from"][0]) if len(other["t"]) else before
    for when, to in zip(other["t"], other["to"]):
        if when < t - within:
            at = int(to)
        elif when <= t + within:
            counts.append(int(to))
    counts.append(at)
    return any(c >= after for c in counts) if after > before else any(c <= after for c in counts)


def test_the_timeline_check_can_fail():
    one = {"t": np.array([1.0, 4.0]), "from": np.array([1, 2]), "to": np.array([2, 4])}
    assert crossed(one, 4.2, 2, 3, 1.0) and crossed(one, 1.5, 1, 2, 1.0)
    assert not crossed(one, 2.5, 2, 4, 1.0)  # 4 only from 4.0, 1.5 s after
    assert not crossed(one, 6.0, 4, 1, 1.0)  # never down to 1
    down = {"t": np.array([1.0, 5.0]), "from": np.array([1, 3]), "to": np.array([3, 1])}
    assert crossed(down, 5.5, 3, 1, 1.0) and not crossed(down, 3.0, 3, 1, 1.0)


def test_virtual_time_agrees_with_the_served_run(runs):
    served, virtual, _, vout = runs
    s = json.loads((served / "summary.json").read_text())["autoscaling"]
    v = json.loads((virtual / "summary.json").read_text())["autoscaling"]
    sa, va = table(served, "scaling"), table(virtual, "scaling")
    # both decide at each sync's instant on the scrape round of that instant; the served
    # run's replicas answer its HTTP a moment later (a new replica is routed to a poll
    # later), so a metric on a threshold may split one decision into two. The timelines
    # agree within one sync period (1 s) and that lag (a quarter period), both ways.
    assert len(sa["t"]) >= 1 and len(va["t"]) >= 1
    assert np.array_equal(va["t"], np.round(va["t"]))  # virtual time decides on the 1 s ticks
    assert sa["to"][-1] == va["to"][-1] and sa["to"].max() == va["to"].max()
    for mine, other in ((sa, va), (va, sa)):
        for t, before, after in zip(mine["t"], mine["from"], mine["to"]):
            assert crossed(other, t, int(before), int(after), 1.25), (t, before, after, sa, va)
    assert abs(s["attainment"] - v["attainment"]) <= 0.05
    assert v["gpu_hours"] == pytest.approx(s["gpu_hours"], rel=0.1)
    assert "x real time" in vout


@pytest.mark.parametrize("args, message", [
    (["--virtual", "--autoscaler", "nope"], "unknown autoscaler 'nope'"),
    (["--virtual", "--autoscaler-param", "target=-1"], "target must be > 0"),
    (["--virtual", "--serve"], "not allowed with argument"),
])
def test_bad_autoscaling_input_is_one_line_and_exit_status_2(tmp_path, args, message):
    done = experiment(str(TRACE_SCENARIO), *args, "--out", str(tmp_path / "x"), timeout=60)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
