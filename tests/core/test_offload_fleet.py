"""KV offloading wherever the engine runs offline: each data-parallel rank and each P/D
replica has a host tier of its own (a prompt stored on one rank is loaded there, and not
on another rank that never computed it), and a decode replica's pull of a prefill's KV is
the same with offloading on as off, while the prefill side loads a repeated prompt from
its host tier. Driven through the drivers `inference-lab sim` runs (`--data-parallel-size`,
`--pd`), with arrivals given one by one."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

from factories import deployment

from inference_lab.cli import main
from inference_lab.common.workload import LengthDist, WorkloadSpec
from inference_lab.engine.drivers.data_parallel import run_data_parallel
from inference_lab.engine.drivers.disagg import run_disaggregated
from inference_lab.engine.sim.kv_transfer import PdLayout
from inference_lab.engine.sim.offload import GIB_BYTES, OffloadConfig

BS = 64
BPT = 24576  # gpt-oss-20b's KV bytes per position on one GPU (bf16)
PROMPT = 4000  # tokens: 62 full blocks
FIXED = LengthDist("fixed", value=1)  # (the lengths come with the arrivals)


def ids(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(4 * n)


def dep(offload: bool, gpu_blocks: int = 200):
    d = deployment()
    d.scheduler = replace(d.scheduler, kv_cache_capacity=BPT * BS * gpu_blocks)
    d.offload = OffloadConfig(4 * GIB_BYTES) if offload else None
    return d


def spec(n: int) -> WorkloadSpec:
    return WorkloadSpec(arrival_pattern="uniform", num_requests=n, input_len_dist=FIXED,
                        output_len_dist=FIXED)


def test_each_data_parallel_rank_loads_only_what_its_own_host_tier_stored():
    # rank 0 computes the prompt, then four others push it out of its 200-block GPU cache;
    # then the prompt goes to rank 0 again and to rank 1, which never saw it
    prompt = ids(PROMPT, 1)
    arrivals = [(0.0, 0, 4, prompt, 0)]
    arrivals += [(10.0 * (s + 1), 0, 4, ids(PROMPT, 100 + s), 0) for s in range(4)]
    arrivals += [(100.0, 0, 4, prompt, 0), (200.0, 0, 4, prompt, 1)]
    records = []
    summary = run_data_parallel(dep(True), spec(len(arrivals)), 2, arrivals=iter(arrivals),
                                records=records)
    assert summary["requests"]["completed"] == len(arrivals)
    (rank0, again), (rank1, elsewhere) = records[5], records[6]
    assert (rank0, rank1) == (0, 1)
    # rank 0's tier held the 62 full blocks (the last block's last token computed again)
    assert again.offload.host_tokens == 62 * BS == again.cached_tokens
    # rank 1's own tier holds nothing of it: computed from scratch
    assert (elsewhere.offload.host_tokens, elsewhere.cached_tokens) == (0, 0)
    ranks = summary["data_parallel"]["ranks"]
    assert [r["host_hits"] for r in ranks] == [62 * BS, 0]
    assert summary["prefix_cache"]["host_hits"] == 62 * BS


def test_offload_off_the_ranks_report_no_host_hits():
    arrivals = [(0.0, 0, 4, ids(PROMPT, 1), 0), (10.0, 0, 4, ids(PROMPT, 1), 1)]
    summary = run_data_parallel(dep(False), spec(2), 2, arrivals=iter(arrivals))
    assert all("host_hits" not in r for r in summary["data_parallel"]["ranks"])
    assert "host_hits" not in summary["prefix_cache"]


def pd_run(offload: bool) -> tuple[dict, list]:
    """One prefill and one decode replica: a prompt, four others that push it out of both
    GPU caches, the prompt again."""
    prompt = ids(PROMPT, 1)
    arrivals = [(0.0, 0, 4, prompt)]
    arrivals += [(10.0 * (s + 1), 0, 4, ids(PROMPT, 100 + s)) for s in range(4)]
    arrivals += [(100.0, 0, 4, prompt)]
    flows = []
    summary = run_disaggregated(dep(offload), spec(len(arrivals)), PdLayout(1, 1),
                                arrivals=iter(arrivals), records=flows)
    assert summary["requests"]["completed"] == len(arrivals) == len(flows)
    return summary, flows


def test_a_decode_replica_pulls_the_same_kv_with_offloading_on_as_off():
    on, on_flows = pd_run(True)
    off, off_flows = pd_run(False)
    repeat_on, repeat_off = on_flows[-1], off_flows[-1]
    # the prefill replica's own tier served the repeat; without offload it computed it
    assert repeat_on.prefill.offload.host_tokens == 62 * BS
    assert repeat_off.prefill.cached_tokens == 0
    assert on["pd"]["prefill"]["prefix_cache"]["host_hits"] == 62 * BS
    # the decode replica pulled every prompt whole, as it does without offload, in the
    # same modelled time
    for a, b in zip(on_flows, off_flows):
        assert a.decode.external_tokens == b.decode.external_tokens == a.prompt_len - 1
        assert a.decode.transfer_s == b.decode.transfer_s > 0
    assert on["pd"]["transfers"] == off["pd"]["transfers"]
    assert on["pd"]["decode"]["prefix_cache"]["host_hits"] == 0


def test_sim_gives_every_rank_and_every_pool_its_host_tier(tmp_path):
    """`inference-lab sim --kv-offloading-size` with `--data-parallel-size 2` and with
    `--pd 1:1`: each rank reports its own host tier's hits, each pool its replicas'."""
    config = Path(__file__).resolve().parents[2] / "configs" / "gpt-oss-20b.toml"
    w = tmp_path / "w.toml"
    w.write_text('[workload]\narrival_pattern = "closed_loop"\nnum_concurrent_users = 4\n'
                 'num_requests = 24\nseed = 1\nshared_prefix_len = 1000\nnum_turns = 3\n'
                 'input_len_dist = { type = "fixed", value = 200 }\n'
                 'output_len_dist = { type = "fixed", value = 20 }\n')

    def sim(*flags: str) -> dict:
        out = tmp_path / "out.json"
        assert main(["sim", "-c", str(config), "-w", str(w), "-q", "-o", str(out),
                     *flags]) == 0
        return json.loads(out.read_text())

    dp = sim("--data-parallel-size", "2", "--kv-offloading-size", "1")
    ranks = dp["data_parallel"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["host_hits"] >= 0 for r in ranks)
    assert sum(r["host_hits"] for r in ranks) == dp["prefix_cache"]["host_hits"]
    pd = sim("--pd", "1:1", "--kv-offloading-size", "1")["pd"]
    assert pd["prefill"]["prefix_cache"]["host_hits"] >= 0
    assert pd["decode"]["prefix_cache"]["host_hits"] >= 0
    assert pd["transfers"]["pulled"] == 24
    off = sim("--data-parallel-size", "2")
    assert all("host_hits" not in r for r in off["data_parallel"]["ranks"])
