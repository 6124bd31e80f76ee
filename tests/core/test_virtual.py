"""Virtual time: the event loop on a simulated clock, the simulated fleet answering as a
served lab does (the offline driver's timings exactly, the fleet's rules, the same JSON),
and the experiment runner on it: deterministic, every request of a trace issued."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import pytest

from inference_lab.autoscale.capacity import outcomes
from inference_lab.common.traces import load_trace
from inference_lab.experiments.controllers import make_controller
from inference_lab.experiments.experiment import run_virtual
from inference_lab.experiments.prompts import Prompt
from inference_lab.experiments.records import load_run
from inference_lab.experiments.runner import Runner
from inference_lab.experiments.scenario import load_scenario, parse_scenario
from inference_lab.experiments.virtual import BASE_PORT, VirtualBackend, VirtualLab, VirtualTimeError
from inference_lab.testing.poll import until
from factories import deployment
from virtual_helpers import overfill, run, send_at

ROOT = Path(__file__).resolve().parents[2]


# ---- the loop -------------------------------------------------------------------------------

def test_a_day_of_sleeping_takes_no_wall_time_and_timers_fire_in_order():
    fired = []

    async def main(loop):
        loop.call_at(7200.0, fired.append, "b")
        loop.call_at(3600.0, fired.append, "a")
        await asyncio.sleep(86_400)
        return loop.time()

    wall = time.perf_counter()
    (t, _), = [run(main)]
    assert t == pytest.approx(86_400.0) and fired == ["a", "b"]
    assert time.perf_counter() - wall < 1.0


def test_waiting_for_what_nothing_will_bring_is_an_error_not_a_hang():
    async def main(loop):
        await loop.create_future()

    with pytest.raises(VirtualTimeError, match="no timer or step"):
        run(main)


# ---- the simulated lab ----------------------------------------------------------------------

def test_each_request_gets_exactly_the_offline_drivers_timings():
    dep = deployment(max_num_seqs=8)
    rng = random.Random(3)
    t, arrivals = 0.0, []
    for _ in range(300):
        t += rng.expovariate(150.0)
        arrivals.append((t, rng.randint(20, 400), rng.randint(5, 120)))
    expected = outcomes(dep, arrivals)

    (results, _), _ = run(lambda loop: send_at(loop, arrivals, VirtualLab(loop, dep)))
    assert all(r.status == 200 for r in results)
    for r, (ttft, e2e), (at, _, output) in zip(results, expected, arrivals):
        assert r.sent == pytest.approx(at, abs=1e-9)
        assert (r.first - r.sent, r.done - r.sent) == (pytest.approx(ttft, abs=1e-9), pytest.approx(e2e, abs=1e-9))
        assert r.completion_tokens == output and r.modelled["e2e_s"] == pytest.approx(e2e, abs=1e-9)


def test_the_fleet_starts_drains_and_refuses_as_a_served_one():
    dep = deployment(max_num_seqs=1, max_waiting=1)

    async def main(loop):
        lab = VirtualLab(loop, dep, replicas=1, startup_delay=20.0)
        http = VirtualBackend(lab).http
        base = f"http://virtual:{BASE_PORT}"
        status, body = await http.request("POST", base + "/control/replicas", {"replicas": 3})
        rows = json.loads(body)
        assert status == 200 and [r["replica"] for r in rows] == [0, 1, 2]
        assert set(rows[0]) == {"model", "replica", "port", "ready", "starting", "draining",
                                "ready_in_s", "waiting", "running", "kv_role"}
        assert [(r["ready"], r["starting"], r["ready_in_s"]) for r in rows] == \
            [(True, False, 0.0), (False, True, 20.0), (False, True, 20.0)]
        endpoint = VirtualBackend(lab).endpoint(f"http://virtual:{BASE_PORT + 1}")
        conn = await endpoint.connect()
        early = await conn.send(endpoint.build(Prompt(None, 10, ""), 5, 0))
        await until(lambda: lab.rows()[1]["ready"], what="replica 1 ready")  # (virtual polls)
        assert loop.time() == pytest.approx(20.0, abs=0.011)
        late = await conn.send(endpoint.build(Prompt(None, 10, ""), 5, 1))
        # one running, one waiting, the third refused at once: 529
        sent = await overfill(lab, endpoint, 1, serial=2)
        third = await sent[2]
        # drain replica 2 and 1 while replica 1 holds two requests: it stays until they end
        status, body = await http.request("POST", base + "/control/replicas", {"replicas": 1})
        draining = [r["replica"] for r in json.loads(body) if r["draining"]]
        metrics = (await http.request("GET", f"http://virtual:{BASE_PORT + 1}/metrics"))[0]
        done = await asyncio.gather(*sent[:2])
        await until(lambda: list(lab.replicas) == [0], what="replica 1 closed")
        _, body = await http.request("GET", base + "/control/replicas")
        return early, late, third, draining, metrics, done, json.loads(body)

    (early, late, third, draining, metrics, done, after), _ = run(main)
    assert early.status == 503 and "starting" in early.error
    assert late.status == 200
    assert third.status == 529 and third.done == third.sent
    assert draining == [1] and metrics == 503  # replica 2 had nothing: closed at once
    assert [r.status for r in done] == [200, 200]  # nothing in flight is lost
    assert [r["replica"] for r in after] == [0]


# ---- the runner in virtual time ------------------------------------------------------------

CLOSED = {
    "name": "v", "duration": 8,
    "server": {"max_num_seqs": 4, "max_waiting": 4},
    "load": {"arrival_pattern": "closed_loop", "num_concurrent_users": 12,
             "input_len_dist": {"type": "uniform", "min": 10, "max": 100},
             "output_len_dist": {"type": "uniform", "min": 20, "max": 200},
             "seed": 5, "retry_after_529": 0.05},
    "controller": {"name": "aimd", "params": {"min_limit": 1}},
    "timeline": [{"at": 4, "capacity": {"max_num_seqs": 2}}],
}


def test_the_same_scenario_in_virtual_time_is_the_same_run_every_time(tmp_path):
    scenario = parse_scenario(CLOSED, "v.toml")
    dep = deployment()

    def once():
        async def main(loop):
            lab = VirtualLab(loop, dep)
            runner = Runner(scenario, "", make_controller("aimd", {"min_limit": 1}),
                            backend=VirtualBackend(lab))
            return (await runner.run()).req
        return run(main)[0]

    a, b = once(), once()
    assert len(a["status"]) > 200 and set(a["status"]) >= {200, 529}
    assert a["send_s"] == b["send_s"] and a["status"] == b["status"] and a["e2e_s"] == b["e2e_s"]
    after = [m for s, m in zip(a["send_s"], a["m_e2e_s"]) if s > 5 and m == m]
    assert after  # the capacity action reached the simulated replica


def test_a_trace_through_the_hpa_in_virtual_time_issues_every_request_and_scales(tmp_path):
    scenario = load_scenario(ROOT / "configs" / "experiments" / "autoscaling-trace.toml")
    summary = run_virtual(scenario, tmp_path)
    trace = load_trace(ROOT / "configs" / "traces" / "burstgpt-sample.csv", "burstgpt", speed=4)
    req = load_run(tmp_path)["requests"]
    due = sorted(req["due_s"])
    assert len(due) == sum(1 for t in trace.times if t < scenario.duration)  # every one, once
    assert due == pytest.approx(sorted(t for t in trace.times if t < scenario.duration), abs=1e-9)
    auto = summary["autoscaling"]
    assert auto["cold_starts"] >= 1 and auto["peak_replicas"] > 1  # the HPA scaled up
    assert 0 <= auto["attainment"] <= 1 and auto["gpu_hours"] > 0
    assert auto["oracle"]["capacity_rps"] > 0 and auto["cost_vs_oracle"] > 0
    assert summary["virtual"] is True and summary["virtual_run"]["engine_steps"] > 0
    for name in ("requests", "fleet", "scaling"):
        assert (tmp_path / f"{name}.parquet").is_file()
    assert "Replicas: desired, ready" in (tmp_path / "report.html").read_text()


def test_faults_virtual_time_does_not_model_are_refused(tmp_path):
    stall = {"at": 5, "fault": {"kind": "stall", "seconds": 1}}
    scenario = parse_scenario({**CLOSED, "timeline": [*CLOSED["timeline"], stall]}, "v.toml")
    with pytest.raises(ValueError, match="'stall' fault at 5 s is not modelled in virtual time"):
        run_virtual(scenario, tmp_path)


def test_a_trace_on_one_server_is_scored_against_its_own_requests_replayed_offline(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text(f"""
name = "t"
duration = 20
[server]
max_num_seqs = 64
[load]
arrival_pattern = "trace"
trace_path = "{ROOT / 'configs' / 'traces' / 'azure-sample.csv'}"
trace_format = "azure"
trace_speed = 4
[[timeline]]
at = 8
capacity = {{ max_num_seqs = 2 }}
""")
    summary = run_virtual(load_scenario(path), tmp_path / "out")
    first, second = summary["phases"]
    assert first["oracle"]["kind"] == second["oracle"]["kind"] == "trace"
    # the same requests, served as the engine's model serves them: the scores are ~1
    assert first["scores"]["goodput"] == pytest.approx(1.0, abs=0.15)
    assert second["oracle"]["e2e_p50_s"] > first["oracle"]["e2e_p50_s"]  # 2 places, not 64


def test_keda_scales_an_idle_fleet_to_zero_and_back_with_a_cold_start(tmp_path):
    # 20 s of load, 25 s of none, then load again: with minReplicaCount 0 and a query on
    # the front's request rate, KEDA scales to zero once the cooldown (10 s) has passed
    # since the rate was last above 0, and back to one at the next poll with requests;
    # the new replica takes its start-up delay (3 s), requests meanwhile find no replica.
    path = tmp_path / "k.toml"
    path.write_text("""
name = "zero"
duration = 60
scrape_interval = 1
[server]
max_num_seqs = 16
[load]
arrival_pattern = "poisson"
rate_schedule = { type = "trace", points = [[0, 20], [20, 20], [20.001, 0], [45, 0], [45.001, 20], [60, 20]] }
input_len_dist = { type = "fixed", value = 32 }
output_len_dist = { type = "fixed", value = 32 }
[fleet]
replicas = 1
startup_delay = 3
metrics_interval = 1
[autoscaler]
name = "keda"
params = { query = "sum(rate(inference_lab_front_requests_total[4s]))", threshold = 100, polling_interval = 2, sync_period = 2, cooldown_period = 10 }
""")
    run_virtual(load_scenario(path), tmp_path / "out")
    run = load_run(tmp_path / "out")
    scaling, req = run["scaling"], run["requests"]
    assert list(scaling["to"]) == [0, 1]
    down, up = scaling["t"]
    assert 30 <= down <= 36  # last active ~22 s (the 4 s rate window), + 10 s cooldown, next poll
    assert 45 <= up <= 48  # the first poll that sees requests again
    unrouted = req["send_s"][req["status"] == 503]
    assert unrouted.size and unrouted.min() >= 45 and unrouted.max() <= up + 3 + 1.5  # the cold start
    assert set(req["status"][req["send_s"] > up + 4]) == {200}
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["autoscaling"]["cold_starts"] == 1


# ---- data-parallel ranks --------------------------------------------------------------------

@pytest.mark.parametrize("model", ["gpt-oss-20b", "llama-3.1-8b"])  # MoE (lockstep), dense
def test_data_parallel_ranks_give_each_request_the_offline_dp_drivers_rank_and_timings(
        model, tmp_path):
    from inference_lab.common.workload import load_workload
    from inference_lab.engine.drivers.data_parallel import run_data_parallel

    dep = deployment(model, max_num_seqs=8, max_waiting=6)
    rng = random.Random(5)
    t, arrivals = 0.0, []
    for _ in range(300):
        t += rng.expovariate(400.0)
        arrivals.append((t, rng.randint(20, 400), rng.randint(5, 120)))
    spec_path = tmp_path / "w.toml"
    spec_path.write_text('[workload]\narrival_pattern = "poisson"\nnum_requests = 1\n'
                         'input_len_dist = { type = "fixed", value = 16 }\n'
                         'output_len_dist = { type = "fixed", value = 4 }\n')
    records = []
    summary = run_data_parallel(dep, load_workload(spec_path), 3,
                                arrivals=iter((a, p, o, b"") for a, p, o in arrivals),
                                records=records)
    assert summary["requests"]["rejected_queue_saturated"] > 0  # the ranks' bounds are met

    (results, lab), _ = run(lambda loop: send_at(loop, arrivals,
                                                 VirtualLab(loop, dep, data_parallel_size=3)))
    dp = lab.replicas[0].dp
    assert dp.lockstep == (model == "gpt-oss-20b")
    assert [r["requests"] for r in dp.summary()["ranks"]] == \
        [r["requests"] for r in summary["data_parallel"]["ranks"]]
    for r, (rank, req), (at, _, _) in zip(results, records, arrivals):
        assert r.status == (200 if req is not None else 529)
        if req is not None:
            assert (r.first, r.done) == (pytest.approx(req.first_token, abs=1e-9),
                                         pytest.approx(req.finish_time, abs=1e-9))


DP_SCENARIO = """
name = "dp"
duration = 6
model = "gpt-oss-20b"
[server]
config = "{config}"
data_parallel_size = {size}
[load]
arrival_pattern = "closed_loop"
num_concurrent_users = 24
input_len_dist = {{ type = "fixed", value = 16 }}
output_len_dist = {{ type = "fixed", value = 200 }}
seed = 1
[controller]
name = "fixed"
params = {{ limit = 0 }}
"""


def test_a_scenario_s_data_parallel_ranks_serve_as_sim_runs_them_and_the_oracle_knows(tmp_path):
    path = tmp_path / "dp.toml"
    path.write_text(DP_SCENARIO.format(config=ROOT / "configs" / "gpt-oss-20b.toml", size=4))
    scenario = load_scenario(path)
    assert scenario.data_parallel_size == 4
    summary = run_virtual(scenario, tmp_path / "out")
    phase, = summary["phases"]
    # 24 users over 4 lockstep ranks of gpt-oss-20b, 6 each: ~194 ms a reply (one core:
    # ~293 ms), as `sim --data-parallel-size 4` has it, and so does the oracle
    assert phase["steady"]["e2e_p50_s"] == pytest.approx(0.1939, abs=5e-4)
    assert phase["oracle"]["e2e_p50_s"] == pytest.approx(phase["steady"]["e2e_p50_s"], rel=1e-3)
    ranks = summary["virtual_run"]["data_parallel"]["0"]["ranks"]
    assert len(ranks) == 4 and all(r["requests"] > 0 and r["refused"] == 0 for r in ranks)


def test_data_parallel_ranks_are_refused_where_they_cannot_be_made(tmp_path, capsys):
    from inference_lab.cli import main
    from inference_lab.common.toml import ConfigError

    path = tmp_path / "dp.toml"
    path.write_text(DP_SCENARIO.format(config=ROOT / "configs" / "gpt-oss-20b.toml", size=2))
    # the server at a URL has the ranks it was started with
    assert main(["experiment", str(path), "--url", "http://127.0.0.1:9",
                 "--out", str(tmp_path / "o")]) != 0
    assert "the server at --url has the ranks it was started with" in capsys.readouterr().err
    path.write_text(DP_SCENARIO.format(config=ROOT / "configs" / "gpt-oss-20b.toml", size=1))
    assert main(["experiment", str(path), "--url", "http://127.0.0.1:9", "--out",
                 str(tmp_path / "o"), "--data-parallel-size", "2"]) != 0  # the flag's too
    assert "started with" in capsys.readouterr().err
    path.write_text(DP_SCENARIO.format(config=ROOT / "configs" / "gpt-oss-20b.toml", size=0))
    with pytest.raises(ConfigError, match="data_parallel_size"):
        load_scenario(path)
