"""`inference-lab sim` on a disaggregated deployment: the pools' figures and how they add
up, a prefill replica whose KV is full of handoffs waiting for the pulls, the [pd] config
table and the flags, with errors naming the field."""

import dataclasses
import json
from pathlib import Path

import pytest

from inference_lab.cli import main
from inference_lab.common.toml import ConfigError
from inference_lab.common.workload import load_workload
from inference_lab.engine.drivers.disagg import PdError, run_disaggregated
from inference_lab.engine.drivers.offline import run_offline
from inference_lab.engine.sim.config import load_deployment
from inference_lab.engine.sim.kv import bytes_per_token
from inference_lab.engine.sim.kv_transfer import PdLayout

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "gpt-oss-20b.toml"
CLOSED_24 = ROOT / "configs" / "workloads" / "chat-closed-loop-24.toml"


def workload(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "w.toml"
    path.write_text("[workload]\n" + text)
    return path


def test_a_request_s_ttft_is_its_prefill_replica_s_plus_its_decode_replica_s():
    dep = load_deployment(CONFIG, "b200")
    spec = load_workload(CLOSED_24)
    flows = []
    summary = run_disaggregated(dep, spec, PdLayout(1, 2), records=flows)
    assert summary["requests"]["completed"] == summary["requests"]["total"] == 500 == len(flows)
    pd = summary["pd"]
    assert (pd["prefill"]["replicas"], pd["decode"]["replicas"]) == (1, 2)
    assert pd["transfers"]["pulled"] == 500 and pd["transfers"]["recomputed"] == 0
    for flow in flows:
        pre, dec = flow.prefill, flow.decode
        assert dec.arrival == pre.finish_time == pre.first_token  # no hop between the pools
        assert dec.first_token - flow.arrival == pytest.approx(
            (pre.first_token - pre.arrival) + (dec.first_token - dec.arrival), rel=1e-12)
        assert dec.external_tokens == flow.prompt_len - 1 and dec.transfer_s > 0
    lat = summary["latency_metrics"]
    assert lat["ttft_ms"]["mean"] == pytest.approx(
        pd["prefill"]["latency_metrics"]["ttft_ms"]["mean"]
        + pd["decode"]["latency_metrics"]["ttft_ms"]["mean"], rel=1e-9)
    assert lat["per_token_ms"] == pd["decode"]["latency_metrics"]["per_token_ms"]
    # the decode replicas share the 24 users' decodes; one replica alone would be slower
    alone = run_offline(dep, spec)
    assert lat["per_token_ms"]["mean"] < alone["latency_metrics"]["per_token_ms"]["mean"]
    for pool in ("prefill", "decode"):
        util = pd[pool]["utilization"]
        assert 0 < util["avg_kv_cache_util"] <= util["peak_kv_cache_util"] < 1


def test_a_prefill_replica_full_of_handoffs_waits_for_the_pulls_and_nothing_is_lost(tmp_path):
    dep = load_deployment(CONFIG, "b200")
    block = bytes_per_token(dep) * dep.scheduler.block_size
    dep.scheduler = dataclasses.replace(dep.scheduler, kv_cache_capacity=float(40 * block))
    spec = load_workload(workload(tmp_path, 'arrival_pattern = "batched"\nnum_requests = 12\n'
                                  'input_len_dist = { type = "fixed", value = 1000 }\n'
                                  'output_len_dist = { type = "fixed", value = 20 }\n'))
    summary = run_disaggregated(dep, spec, PdLayout(1, 3))
    # 16 blocks a prompt, 40 in all: at most two handoffs are held, the rest wait
    assert summary["requests"]["completed"] == 12
    assert summary["pd"]["transfers"] == {"pulled": 12, "recomputed": 0,
                                          "external_tokens": 12 * 999}
    assert summary["pd"]["prefill"]["utilization"]["peak_kv_cache_util"] == pytest.approx(32 / 40)
    queue = summary["pd"]["prefill"]["latency_metrics"]["queue_ms"]
    assert queue["p99"] > 5 * queue["min"]  # the last ones waited for pulls to free blocks


def test_pooling_and_lora_workloads_are_refused_by_key(tmp_path):
    dep = load_deployment(CONFIG, "b200")
    spec = load_workload(workload(tmp_path, 'arrival_pattern = "poisson"\nnum_requests = 5\n'
                                  'input_len_dist = { type = "fixed", value = 10 }\n'
                                  'output_len_dist = { type = "fixed", value = 10 }\n'
                                  'lora_adapters = { sql = 0.5 }\n'))
    with pytest.raises(PdError, match="^lora_adapters"):
        run_disaggregated(dep, spec, PdLayout(1, 1))


def config_with(tmp_path: Path, pd: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(CONFIG.read_text() + "\n[pd]\n" + pd)
    return path


def test_the_pd_table_sets_the_pools_the_link_and_the_policy(tmp_path):
    dep = load_deployment(config_with(tmp_path, 'prefill = 2\ndecode = 5\nlink = "nvlink"\n'
                                      'policy = "round_robin"\n'), "b200")
    assert dep.pd == PdLayout(2, 5, "nvlink", "round_robin")
    assert load_deployment(config_with(tmp_path, "prefill = 1\ndecode = 1\n"), "b200").pd == \
        PdLayout(1, 1, "rdma", "least_loaded")
    assert load_deployment(CONFIG, "b200").pd is None


@pytest.mark.parametrize("pd, key, what", [
    ("prefill = 0\ndecode = 1\n", "pd.prefill", "expected an integer >= 1"),
    ("prefill = 1\n", "pd.decode", "missing"),
    ('prefill = 1\ndecode = 1\nlink = "fast"\n', "pd.link", "nvlink, rdma or GBPS"),
    ('prefill = 1\ndecode = 1\nlink = "0@1"\n', "pd.link", "bandwidth > 0"),
    ('prefill = 1\ndecode = 1\npolicy = "random"\n', "pd.policy", "least_loaded | round_robin"),
    ("prefill = 1\ndecode = 1\nratio = 3\n", "pd.ratio", "unknown key"),
])
def test_a_bad_pd_table_is_refused_naming_the_key(tmp_path, pd, key, what):
    with pytest.raises(ConfigError) as info:
        load_deployment(config_with(tmp_path, pd), "b200")
    assert info.value.path == key and what in str(info.value)


def test_sim_pd_flags_run_and_write_the_pools(tmp_path, capsys):
    out = tmp_path / "out.json"
    w = workload(tmp_path, 'arrival_pattern = "poisson"\narrival_rate = 50\nnum_requests = 60\n'
                 'seed = 3\ninput_len_dist = { type = "fixed", value = 800 }\n'
                 'output_len_dist = { type = "fixed", value = 30 }\n')
    assert main(["sim", "-c", str(CONFIG), "-w", str(w), "-q", "--pd", "1:3", "--kv-link",
                 "25@0.05", "--pd-policy", "round_robin", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "1 prefill : 3 decode replicas, KV over 25@0.05" in text
    assert "decode: transfer" in text
    summary = json.loads(out.read_text())
    assert summary["requests"]["completed"] == 60
    pd = summary["pd"]
    assert pd["link"] == {"name": "25@0.05", "bandwidth_gb_per_s": 25.0, "latency_ms": 0.05}
    # 800 tokens = 13 blocks of 64 x 24,576 bytes over 25 GB/s + 50 us, alone on the link
    assert pd["decode"]["latency_metrics"]["transfer_ms"]["min"] == pytest.approx(
        0.05 + 13 * 64 * 24576 / 25e9 * 1e3, rel=1e-9)
    assert set(pd["prefill"]["latency_metrics"]) == {"ttft_ms", "queue_ms", "prefill_ms"}
    assert set(pd["decode"]["latency_metrics"]) == {"ttft_ms", "queue_ms", "transfer_ms",
                                                    "per_token_ms", "e2e_ms"}
    # a config's [pd] runs disaggregated without flags; --pd off runs it on one replica
    config = config_with(tmp_path, "prefill = 1\ndecode = 2\n")
    assert main(["sim", "-c", str(config), "-w", str(w), "-q", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["pd"]["decode_replicas"] == 2
    assert main(["sim", "-c", str(config), "-w", str(w), "-q", "--pd", "off", "-o", str(out)]) == 0
    assert "pd" not in json.loads(out.read_text())


@pytest.mark.parametrize("flags, message", [
    (["--pd", "0:2"], "--pd: expected P:D with at least one replica in each pool, got '0:2'"),
    (["--pd", "1-3"], "--pd: expected P:D, two counts of replicas"),
    (["--pd", "1:1", "--kv-link", "infiniband"], "--kv-link: a KV link is nvlink, rdma or GBPS"),
    (["--kv-link", "rdma"], "--kv-link: needs a disaggregated deployment"),
    (["--pd-policy", "round_robin"], "--pd-policy: needs a disaggregated deployment"),
])
def test_bad_pd_flags_are_refused_naming_the_flag(flags, message, capsys):
    assert main(["sim", "-c", str(CONFIG), "-w", str(CLOSED_24), "-q", *flags]) == 2
    assert message in capsys.readouterr().err


def test_the_engine_says_it_does_not_serve_a_pd_table(tmp_path, caplog):
    from inference_lab.cli import build_parser
    from inference_lab.cli.cmd_engine import load_deployments

    config = config_with(tmp_path, 'prefill = 1\ndecode = 3\nlink = "nvlink"\n')
    [dep] = load_deployments(build_parser().parse_args(["engine", "--config", str(config)]))
    assert dep.pd == PdLayout(1, 3, "nvlink")
    assert "--replicas 4 --kv-roles 1:3 --kv-link nvlink" in caplog.text
