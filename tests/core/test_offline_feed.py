"""The three offline drivers (one core, data-parallel ranks, prefill and decode pools) on
small fixed workloads: open-loop arrivals, closed-loop users with jittered starts,
multi-turn conversations with shared prefixes, LoRA adapters and refusals at the waiting
bound. The expected figures are what each driver gave for these seeds; the same seed must
give the same per-request outcomes, to the last digit."""

import dataclasses
from pathlib import Path

from inference_lab.common.workload import LengthDist, WorkloadSpec
from inference_lab.engine.drivers.data_parallel import run_data_parallel
from inference_lab.engine.drivers.disagg import run_disaggregated
from inference_lab.engine.drivers.offline import run_offline
from inference_lab.engine.sim.config import load_deployment
from inference_lab.engine.sim.kv_transfer import PdLayout

ROOT = Path(__file__).resolve().parents[2]
MOE = ROOT / "configs" / "gpt-oss-20b.toml"
DENSE = ROOT / "configs" / "llama-3.1-8b.toml"

CLOSED = WorkloadSpec("closed_loop", 60, LengthDist("uniform", min=50, max=400),
                      LengthDist("uniform", min=5, max=60), num_concurrent_users=8,
                      closed_loop_jitter_secs=0.3, seed=3, shared_prefix_len=64,
                      num_shared_prefixes=2, num_turns=3)
OPEN = WorkloadSpec("poisson", 60, LengthDist("uniform", min=50, max=800),
                    LengthDist("uniform", min=5, max=80), arrival_rate=60.0, seed=5)
OPEN_LORA = dataclasses.replace(OPEN, lora_adapters=(("a", 0.5), ("b", 0.3)), max_loras=2)


def deployment(path: Path, max_waiting: int, max_num_seqs: int):
    dep = load_deployment(path, "b200", max_waiting)
    dep.scheduler = dataclasses.replace(dep.scheduler, max_num_seqs=max_num_seqs)
    return dep


def figures(summary: dict, *extra) -> tuple:
    """The summary's figures that follow from the per-request outcomes (not the CPU's):
    (completed, total, rejected, rejected_queue_saturated, rejected_invalid), steps, the
    simulated span, the prefix cache's hits, then TTFT, end to end and per token (ms):
    min, mean, p50 and p99 each; then `extra`."""
    lat = summary["latency_metrics"]
    return (tuple(summary["requests"].values()), summary["simulation"]["steps"],
            round(summary["simulation"]["simulated_seconds"], 9), summary["prefix_cache"].get("hits"),
            tuple(round(lat[k][q], 6) for k in ("ttft_ms", "e2e_ms", "per_token_ms")
                  for q in ("min", "mean", "p50", "p99")), *extra)


def dp_figures(summary: dict, records: list) -> tuple:
    """... with the rank of each request in order (x: refused) and the sum of finishes."""
    return figures(summary, "".join(str(rank) if req is not None else "x" for rank, req in records),
                   round(sum(req.finish_time for _, req in records if req is not None), 9))


def pd_figures(summary: dict, flows: list) -> tuple:
    """... with the first five flows' (arrival, decode finish) and the sum of finishes."""
    first = tuple((round(f.arrival, 9), round(f.decode.finish_time, 9)) for f in flows[:5])
    return figures(summary, first,
                   round(sum(f.decode.finish_time for f in flows), 9))


def test_one_core_closed_loop_conversations_with_refusals():
    assert figures(run_offline(deployment(MOE, 2, 4), CLOSED)) == EXPECTED["offline_closed"]


def test_one_core_open_loop_with_lora_adapters():
    assert figures(run_offline(deployment(DENSE, 4, 8), OPEN_LORA)) == EXPECTED["offline_open_lora"]


def test_data_parallel_ranks_closed_loop_with_lora_adapters_and_refusals():
    records = []
    spec = dataclasses.replace(CLOSED, lora_adapters=(("a", 0.6),), num_concurrent_users=12)
    summary = run_data_parallel(deployment(DENSE, 1, 4), spec, 2, records=records)
    assert dp_figures(summary, records) == EXPECTED["dp_closed"]


def test_data_parallel_moe_ranks_open_loop():
    records = []
    summary = run_data_parallel(deployment(MOE, 2, 8), OPEN, 2, records=records)
    assert dp_figures(summary, records) == EXPECTED["dp_open"]


def test_prefill_and_decode_pools_closed_loop():
    flows = []
    summary = run_disaggregated(deployment(MOE, 2, 4), CLOSED, PdLayout(1, 2), records=flows)
    assert pd_figures(summary, flows) == EXPECTED["pd_closed"]


def test_prefill_and_decode_pools_open_loop_round_robin():
    flows = []
    layout = PdLayout(2, 1, policy="round_robin")
    summary = run_disaggregated(deployment(MOE, 3, 8), OPEN, layout, records=flows)
    assert pd_figures(summary, flows) == EXPECTED["pd_open"]


# what each driver gave for these seeds (figures(), dp_figures(), pd_figures())
EXPECTED = {'offline_closed': ((41, 60, 0, 19, 0), 426, 0.342091516, 10624,
                    (1.499738, 6.821742, 3.048638, 30.508368, 6.684767, 33.696042, 32.40575,
                     75.275428, 0.502184, 0.812286, 0.855684, 0.934216)),
 'offline_open_lora': ((60, 60, 0, 0, 0), 511, 1.069058442, 0,
                       (1.981373, 7.685187, 5.083392, 42.538004, 21.154244, 97.386805, 102.153656,
                        170.475601, 1.916299, 2.084852, 2.062063, 2.646009)),
 'dp_closed': ((35, 60, 0, 25, 0), 393, 0.409873533, 1984,
               (1.903166, 8.720806, 4.575955, 44.921821, 12.523116, 70.277009, 67.872005,
                144.687007, 1.887184, 1.980878, 1.936047, 2.182815),
               '0101x10101xx01x1010x0101x1xx0xx10x01x1xxx1x1xx01x1xx0x01xx0x', 9.193185352),
 'dp_open': ((60, 60, 0, 0, 0), 2066, 0.955094803, 0,
             (1.499055, 2.02264, 1.858503, 3.234803, 5.696049, 26.627584, 25.30329, 53.204621,
              0.45487, 0.565741, 0.541435, 0.776487),
             '010101010101010101010100101010101010101011010101001001010101', 28.41285449),
 'pd_closed': ((59, 60, 0, 1, 0), 1045, 0.307948084, 14720,
               (2.100527, 2.948729, 2.868658, 4.428809, 5.137207, 23.643973, 21.92205, 46.028607,
                0.454724, 0.642418, 0.685101, 0.808449),
               ((0.003950397, 0.023799838), (0.019658658, 0.029039555), (0.023799838, 0.043518645),
                (0.029039555, 0.046971446), (0.046971446, 0.057545573)),
               11.520824679),
 'pd_open': ((60, 60, 0, 0, 0), 1375, 0.962078648, 0,
             (2.068652, 2.817127, 2.71672, 3.878283, 7.644962, 31.452089, 30.884131, 62.958018,
              0.45487, 0.662137, 0.633397, 0.928581),
             ((0.016744726, 0.041050829), (0.034193002, 0.048909204), (0.016254156, 0.063570197),
              (0.041941104, 0.082909316), (0.060703179, 0.082909316)),
             28.702324805)}
