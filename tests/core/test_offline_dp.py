"""Data-parallel ranks in the offline driver: an MoE deployment's ranks in lockstep (each
aligned step as long as the slowest rank's, idle ranks on one-token dummy passes), dense
ranks independent, vLLM's stale balancer between the coordinator's publications, each
rank's own waiting bound, and `inference-lab sim --data-parallel-size`."""

import dataclasses
import json
import random
from pathlib import Path

import pytest

from inference_lab.cli import main
from inference_lab.common.workload import load_workload, open_loop_arrivals
from inference_lab.engine.drivers.data_parallel import DataParallelRanks, is_moe, run_data_parallel
from inference_lab.engine.drivers.offline import run_offline
from inference_lab.engine.sim.config import load_deployment
from inference_lab.engine.sim.core import EngineCore, QueueSaturated

ROOT = Path(__file__).resolve().parents[2]
MOE = ROOT / "configs" / "gpt-oss-20b.toml"
DENSE = ROOT / "configs" / "llama-3.1-8b.toml"
CLOSED_24 = ROOT / "configs" / "workloads" / "chat-closed-loop-24.toml"


def spec_file(tmp_path: Path, text: str = 'arrival_pattern = "poisson"\nnum_requests = 1\n'
              'input_len_dist = { type = "fixed", value = 16 }\n'
              'output_len_dist = { type = "fixed", value = 4 }\n'):
    path = tmp_path / "w.toml"
    path.write_text("[workload]\n" + text)
    return load_workload(path)


def steps_alone(dep, requests):
    """The step durations of `requests` ((prompt, output) each, all at t = 0) on one core."""
    core = EngineCore(dep)
    for prompt, output in requests:
        core.submit(prompt, output, 0.0)
    spans = []
    while (t := core.next_event_time()) is not None:
        r = core.step(t)
        spans.append(r.end - r.start)
    return spans


def test_the_models_are_known_moe_or_dense():
    assert is_moe(load_deployment(MOE, "b200"))
    assert not is_moe(load_deployment(DENSE, "b200"))


def test_moe_ranks_step_as_long_as_the_slowest_and_idle_ranks_run_dummy_passes(tmp_path):
    dep = load_deployment(MOE, "b200")
    # Rank 0 gets four requests of 16 prompt tokens and 3 output tokens, rank 1 one of 16
    # and 5, rank 2 none; all at t = 0 (pinned, as X-data-parallel-rank pins them).
    # Alone, rank 0 steps A1 (64 prefill tokens, first tokens), A2, A3 (four decodes),
    # rank 1 steps B1 (16 prefill tokens), B2..B5 (one decode each). In lockstep each of
    # the first three aligned steps lasts max(Ai, Bi) (rank 2 runs a dummy pass in each);
    # in the 4th and 5th rank 1 decodes alone, ranks 0 and 2 run dummy passes, D each
    # (one token attending one position): max(Bi, D). So rank 0's requests end at
    # max(A1,B1) + max(A2,B2) + max(A3,B3), rank 1's that plus max(B4,D) + max(B5,D);
    # dummy passes: 3 (rank 2) + 2 x 2 (ranks 0 and 2) = 7, in 5 aligned steps.
    a = steps_alone(dep, [(16, 3)] * 4)
    b = steps_alone(dep, [(16, 5)])
    assert len(a) == 3 and len(b) == 5
    d = EngineCore(dep).shortest_step()
    assert a[0] > b[0] and a[1] > b[1]  # the busier rank is the slower one (no free lunch)
    arrivals = [(0.0, 16, 3, b"", 0)] * 4 + [(0.0, 16, 5, b"", 1)]
    records = []
    summary = run_data_parallel(dep, spec_file(tmp_path), 3, arrivals=iter(arrivals),
                                records=records)
    dp = summary["data_parallel"]
    assert dp["lockstep"] and dp["aligned_steps"] == 5 and dp["dummy_passes"] == 7
    first3 = sum(max(x, y) for x, y in zip(a, b))
    reqs = [req for _, req in records]
    for req in reqs[:4]:
        assert req.first_token == pytest.approx(max(a[0], b[0]), rel=1e-12)
        assert req.finish_time == pytest.approx(first3, rel=1e-12)
    slow = reqs[4]
    assert slow.first_token == pytest.approx(max(a[0], b[0]), rel=1e-12)
    assert slow.finish_time == pytest.approx(first3 + max(b[3], d) + max(b[4], d), rel=1e-12)
    assert slow.finish_time > sum(b) * 1.0001  # alone it would have finished sooner
    assert [r["steps"] for r in dp["ranks"]] == [3, 5, 0]  # steps of their own


def test_a_throttled_idle_rank_s_dummy_passes_hold_every_rank_back():
    dep = load_deployment(MOE, "b200")
    dp = DataParallelRanks(dep, 2)
    dp.cores[1].slowdown = 50.0  # rank 1's GPU runs 50 x slower; it has no request
    # Rank 0's one request of 16 prompt tokens and 2 output tokens takes two steps, S1
    # and S2, alone; rank 1 runs a dummy pass in each, 50 x D long (D: one token, one
    # position), longer than S1 and S2: each aligned step lasts 50 x D.
    s = steps_alone(dep, [(16, 2)])
    d = EngineCore(dep).shortest_step()
    assert 50 * d > max(s)
    req = dp.cores[dp.route(0.0)].submit(16, 2, 0.0)
    while (t := dp.next_step_time()) is not None:
        dp.step(t)
    assert req.first_token == pytest.approx(50 * d, rel=1e-12)
    assert req.finish_time == pytest.approx(100 * d, rel=1e-12)
    assert (dp.aligned_steps, dp.dummy_passes) == (2, 2)


def test_dense_ranks_are_independent_single_core_runs_of_the_arrivals_routed_to_them(tmp_path):
    dep = load_deployment(DENSE, "b200", 6)  # max_waiting 6: some refusals
    dep.scheduler = dataclasses.replace(dep.scheduler, max_num_seqs=8)
    spec = spec_file(tmp_path, 'arrival_pattern = "poisson"\narrival_rate = 400.0\n'
                               'num_requests = 400\nseed = 3\n'
                               'input_len_dist = { type = "uniform", min = 50, max = 900 }\n'
                               'output_len_dist = { type = "uniform", min = 20, max = 200 }\n')
    arrivals = list(open_loop_arrivals(spec, random.Random(spec.seed)))
    records = []
    summary = run_data_parallel(dep, spec, 3, arrivals=iter(arrivals), records=records)
    dp = summary["data_parallel"]
    assert not dp["lockstep"] and dp["dummy_passes"] == 0
    assert summary["requests"]["rejected_queue_saturated"] > 0  # the bound is exercised
    assert sum(r["requests"] for r in dp["ranks"]) == 400
    for rank in range(3):
        core = EngineCore(dep)
        mine = [(arr, rec) for arr, rec in zip(arrivals, records) if rec[0] == rank]
        assert len(mine) == dp["ranks"][rank]["requests"] > 50
        alone = []
        for (t, prompt, output, _), _ in mine:
            while (ts := core.next_event_time()) is not None and ts < t:
                core.step(ts)
            try:
                alone.append(core.submit(prompt, output, t))
            except QueueSaturated:
                alone.append(None)
        while (ts := core.next_event_time()) is not None:
            core.step(ts)
        for ((_, _, _, _), (_, req)), solo in zip(mine, alone):
            assert (req is None) == (solo is None)
            if req is not None:
                assert (req.first_token, req.finish_time) == (solo.first_token, solo.finish_time)


def test_a_burst_is_spread_by_local_additions_until_a_publication_brings_the_real_counts(tmp_path):
    dep = load_deployment(DENSE, "b200")
    # t = 0: A (2000 tokens out) -> the coordinator's first publication (all zero) is
    # made; A goes to rank 0. The counts move, so the next publication is at 0.1:
    # rank 0 (0 waiting, 1 running), rank 1 (0, 0).
    # 0.12, 0.13, 0.14: B (1 token out), C (2000), D (1): no publication before 0.2, so
    # the front end scores its estimate (4 x waiting + running) plus its own additions:
    # B: r0 1, r1 0 -> r1 (r1 waiting +1: 4); C: r0 1 < 4 -> r0 (5); D: r1 4 < 5 -> r1
    # (8). Without the local additions all three would go to rank 1 (1 > 0 each time).
    # 0.2: a publication; B and D (one token each) are done: rank 0 (0, 2), rank 1 (0, 0).
    # 0.25: E: the estimate would say r0 (5 < 8), the published counts say r1 (2 > 0).
    arrivals = [(0.0, 16, 2000, b""), (0.12, 16, 1, b""), (0.13, 16, 2000, b""),
                (0.14, 16, 1, b""), (0.25, 16, 2000, b"")]
    records = []
    summary = run_data_parallel(dep, spec_file(tmp_path), 2, arrivals=iter(arrivals),
                                records=records)
    assert [rank for rank, _ in records] == [0, 1, 0, 1, 1]
    assert all(req is not None for _, req in records)
    assert records[1][1].finish_time < 0.2 and records[3][1].finish_time < 0.2


def test_the_balancer_is_published_the_cores_counts_on_the_coordinators_schedule(tmp_path):
    dep = load_deployment(DENSE, "b200")
    dp = DataParallelRanks(dep, 2)
    assert dp.route(0.0) == 0 and dp.publications == 1  # the first publication: zeros
    dp.cores[0].submit(16, 100, 0.0)
    assert dp.route(0.01) == 1  # too soon to publish: the local addition decides (4 > 0)
    dp.cores[1].submit(16, 100, 0.01)
    dp.cores[1].step(0.01)  # rank 1's request runs: real counts (1, 0) and (0, 1)
    assert dp.next_publication() == pytest.approx(0.1)  # the counts moved: 100 ms after
    assert not dp.observe(0.05) and dp.balancer.estimate() == [(1, 0), (1, 0)]
    assert dp.observe(0.1) and dp.balancer.estimate() == [(1, 0), (0, 1)]
    assert dp.next_publication() == pytest.approx(5.1)  # unchanged: the idle interval
    assert dp.route(0.2) == 1  # 4 x 1 + 0 against 4 x 0 + 1
    assert dp.route(0.2, rank=0) == 0 and dp.balancer.estimate()[0] == (1, 0)  # pinned:
    # no local addition
    assert not dp.observe(0.3)  # an event at 0.3: nothing moved since 0.1, not due
    dp.cores[0].submit(16, 100, 0.3)  # the counts move at 0.3, after 0.1 + 100 ms:
    assert dp.next_publication() == pytest.approx(0.3)  # published at once, not at 0.2
    with pytest.raises(ValueError, match="out of range"):
        dp.route(0.3, rank=2)


def test_each_rank_admits_what_its_own_waiting_bound_allows_of_what_the_balancer_sent_it(tmp_path):
    dep = load_deployment(DENSE, "b200", 16)  # max_waiting 16 on each rank
    dep.scheduler = dataclasses.replace(dep.scheduler, max_num_seqs=16)
    # 70 requests at t = 0 over 4 ranks: one publication (all zero) at t = 0, then the
    # local additions deal them round robin (0, 1, 2, 3, 0, ...): 18, 18, 17, 17. No
    # step runs before the last of them is booked, so each rank admits 16 and refuses
    # the rest: 2, 2, 1, 1. The estimate is now 18, 18, 17, 17 waiting. 6 more at 0.05
    # (before the next publication, at 0.1): r2 (68 < 72), r3, then all tied at 18 x 4:
    # r0, r1, r2, r3; by then every rank has moved its 16 to running (max_num_seqs 16),
    # so all six are admitted: ranks 0..3 get 1, 1, 2, 2.
    arrivals = [(0.0, 16, 100, b"")] * 70 + [(0.05, 16, 100, b"")] * 6
    records = []
    summary = run_data_parallel(dep, spec_file(tmp_path), 4, arrivals=iter(arrivals),
                                records=records)
    ranks = summary["data_parallel"]["ranks"]
    assert [r["requests"] for r in ranks] == [19, 19, 19, 19]
    assert [r["admitted"] for r in ranks] == [17, 17, 18, 18]
    assert [r["refused"] for r in ranks] == [2, 2, 1, 1]
    assert [rank for rank, _ in records[70:]] == [2, 3, 0, 1, 2, 3]
    assert summary["requests"]["rejected_queue_saturated"] == 6
    assert summary["requests"]["completed"] == 70


def test_one_rank_is_the_single_core_offline_run():
    dep = load_deployment(MOE, "b200")
    spec = load_workload(CLOSED_24)
    one = run_data_parallel(dep, spec, 1)
    alone = run_offline(dep, spec)
    assert one["latency_metrics"] == alone["latency_metrics"]
    assert one["requests"] == alone["requests"]
    assert one["data_parallel"]["dummy_passes"] == 0


def test_sim_command_prints_and_writes_the_ranks(tmp_path, capsys):
    out = tmp_path / "dp.json"
    assert main(["sim", "-c", str(MOE), "-w", str(CLOSED_24), "-q",
                 "--data-parallel-size", "4", "-o", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())  # (rich wraps at the terminal's width)
    assert "4 data-parallel ranks, lockstep (MoE)" in printed and "dummy passes" in printed
    summary = json.loads(out.read_text())
    dp = summary["data_parallel"]
    assert dp["size"] == 4 and len(dp["ranks"]) == 4
    # 24 closed-loop users dealt over 4 ranks: 6 each, 125 of the 500 requests each
    assert [r["requests"] for r in dp["ranks"]] == [125] * 4
    assert summary["requests"]["completed"] == 500


@pytest.mark.parametrize("args, message", [
    (["--data-parallel-size", "0"], "--data-parallel-size: must be at least 1"),
    (["--data-parallel-size", "2", "--pd", "1:1"], "not with a disaggregated deployment"),
])
def test_sim_command_refuses_bad_data_parallel_flags(tmp_path, capsys, args, message):
    assert main(["sim", "-c", str(MOE), "-w", str(CLOSED_24), "-q", *args]) != 0
    assert message in capsys.readouterr().err
