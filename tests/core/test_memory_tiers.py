"""A deployment config's [memory] tiers (inference-lab's layout) turn KV offloading on: a
host-memory store becomes the host tier and an NVMe store the disk tier, each sized as
the replica's share of the store (or of its [memory.capacity] cap); what the lab does not
model (peer HBM, a cluster store, the policies) is listed by name; without a host tier
nothing changes; the flags win over the config."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from inference_lab.cli.offload_flags import apply_offload
from inference_lab.common.toml import ConfigError
from inference_lab.engine.sim.catalog import Catalog
from inference_lab.engine.sim.config import load_deployment
from inference_lab.engine.sim.offload import GIB_BYTES
from inference_lab.engine.sim.offload.memory_tiers import replica_share

# a B200 node as inference-lab's catalog shapes it: 8 GPUs, 2 TB of host DRAM and a 30 TB
# NVMe pool per node, peer HBM, a cluster NVMe pool
STORES = [("peer_hbm", "node", 'kind = "peer_hbm"'), ("host_dram", "node", "capacity = 2.0e12"),
          ("nvme", "node", "capacity = 3.0e13"), ("cluster_nvme", "cluster", "capacity = 1.2e14"),
          ("hbm_spill", "gpu", "")]
NODE = """\
flops_bf16 = 2.25e15
memory_bandwidth = 8.0e12
memory_capacity = 192e9
[fabric]
gpus_per_node = 8
scale_up = { bandwidth = 9.0e11, latency = 5e-6 }
[memory]
""" + "".join(f'[[memory.stores]]\nname = "{name}"\nper = "{per}"\n{extra}\n'
              for name, per, extra in STORES)


def load(tmp_path: Path, memory: str, tp: int = 1):
    (tmp_path / "hardware").mkdir(exist_ok=True)
    (tmp_path / "hardware" / "node.toml").write_text(NODE)
    config = tmp_path / "m.toml"
    config.write_text(f'model = "gpt-oss-20b"\n[hardware.node]\ntp = {tp}\n{memory}')
    return load_deployment(config, "node", catalog=Catalog([tmp_path]))


def test_host_dram_and_nvme_tiers_are_the_host_and_disk_tiers_of_the_replica_s_share(tmp_path):
    dep = load(tmp_path, '[memory]\ntiers = ["host_dram", "nvme"]\n')
    # a node's store is shared by its 8 one-GPU replicas: 2e12 / 8 and 3e13 / 8 bytes each
    assert (dep.offload.cpu_bytes, dep.offload.disk_bytes) == (2.5e11, 3.75e12)
    assert not any("host_dram" in n or "nvme" in n for n in dep.unmodelled)


def test_a_capacity_caps_the_store_and_a_wider_replica_takes_a_larger_share(tmp_path):
    dep = load(tmp_path, '[memory]\ntiers = ["host_dram"]\n[memory.capacity]\nhost_dram = 1.0e12\n',
               tp=4)
    # 1e12 per node, two tp-4 replicas per node
    assert (dep.offload.cpu_bytes, dep.offload.disk_bytes) == (5.0e11, 0.0)


def test_what_offloading_does_not_model_is_listed_by_name(tmp_path):
    dep = load(tmp_path, '[memory]\ntiers = ["peer_hbm", "host_dram", "cluster_nvme", "hbm_spill"]\n'
                         'write = { policy = "write_through" }\n')
    assert dep.offload.cpu_bytes == 2.5e11 and dep.offload.disk_bytes == 0
    notes = " | ".join(dep.unmodelled)
    assert "memory tier peer_hbm (not a host or disk store): parsed, not modelled" in notes
    assert "memory tier cluster_nvme (shared by every replica): parsed, not modelled" in notes
    assert "memory tier hbm_spill (not a host or disk store): parsed, not modelled" in notes
    assert "memory write: parsed, not modelled" in notes


def test_an_nvme_tier_alone_turns_nothing_on(tmp_path):
    dep = load(tmp_path, '[memory]\ntiers = ["nvme"]\n')
    assert dep.offload is None
    assert any("nvme (a disk tier needs a host tier before it)" in n for n in dep.unmodelled)


def test_without_memory_tiers_offloading_stays_off(tmp_path):
    assert load(tmp_path, "").offload is None
    assert load(tmp_path, "[memory]\ntiers = []\n").offload is None


def test_a_bad_capacity_names_its_key(tmp_path):
    with pytest.raises(ConfigError) as info:
        load(tmp_path, '[memory]\ntiers = ["host_dram"]\n[memory.capacity]\nhost_dram = -1\n')
    assert "memory.capacity.host_dram" in str(info.value)


def test_the_flags_win_over_the_config_s_tiers(tmp_path):
    dep = load(tmp_path, '[memory]\ntiers = ["host_dram", "nvme"]\n')
    args = argparse.Namespace(kv_offloading_size=4.0, kv_offloading_backend=None,
                              kv_offloading_disk_size=None, kv_transfer_config=None)
    apply_offload(args, [dep])
    assert (dep.offload.cpu_bytes, dep.offload.disk_bytes) == (4 * GIB_BYTES, 0.0)


@pytest.mark.parametrize("per, tp, expected", [
    ("gpu", 2, 2.0), ("node", 1, 1 / 8), ("node", 8, 1.0), ("node", 16, 2.0), ("cluster", 1, 0.0)])
def test_a_replica_s_share_of_a_store(per, tp, expected):
    assert replica_share(per, 1.0, tp, 8) == expected
