"""Scenario files: the shipped ones load, phases follow the timeline, and bad input is
refused naming the file and the key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from inference_lab.common.toml import ConfigError
from inference_lab.experiments.oracle import deployment_for
from inference_lab.experiments.scenario import load_scenario, parse_scenario
from inference_lab.experiments.summary import settle_seconds, step_series

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
BASE = {"duration": 10, "load": {"arrival_pattern": "closed_loop", "num_concurrent_users": 4,
                                 "input_len_dist": {"type": "fixed", "value": 8},
                                 "output_len_dist": {"type": "fixed", "value": 8}}}


@pytest.mark.parametrize("name", ["reference-page", "capacity-step", "overload-ramp", "slow-replica",
                                  "multi-turn"])
def test_the_shipped_scenarios_load(name):
    sc = load_scenario(ROOT / "configs" / "experiments" / f"{name}.toml")
    assert sc.name == name and sc.timeline and sc.config.is_file()


def test_the_offload_scenario_gives_its_deployment_the_host_tier_and_the_other_arm_none():
    # 256 GiB over Llama-3.1-8B's 64-token chunks of 8 MiB: 32,768 chunks (the workload's comments)
    sc = load_scenario(ROOT / "configs" / "experiments" / "kv-offload.toml")
    assert (sc.kv_offloading_size, sc.hardware, sc.timeline) == (256.0, "h100", ())
    dep = deployment_for(sc)
    assert dep.offload.cpu_bytes == 256 * 2**30
    assert deployment_for(dataclasses.replace(sc, kv_offloading_size=None)).offload is None


def test_phases_follow_the_timeline():
    sc = load_scenario(ROOT / "configs" / "experiments" / "capacity-step.toml")
    phases = sc.phases()
    assert [(p.start, p.end, p.max_num_seqs, p.max_waiting) for p in phases] == \
        [(0, 20, 32, 16), (20, 40, 8, 16), (40, 60, 32, 16)]
    assert phases[0].action is None and phases[1].action.at == 20


@pytest.mark.parametrize("change, key", [
    ({"bogus": 1}, "bogus: unknown key"),
    ({"duration": -1}, "duration: expected a number of seconds > 0"),
    ({"timeline": [{"at": 99, "capacity": {"max_num_seqs": 2}}]}, "timeline[0].at"),
    ({"timeline": [{"at": 1, "capacity": {"max_num_seqs": 0}}]}, "timeline[0].capacity.max_num_seqs"),
    ({"timeline": [{"at": 1}]}, "timeline[0].capacity: expected a `capacity`, `load`, `fault` table or `replicas`"),
    ({"controller": {"name": "aimd", "rtt": "p99"}}, "controller.rtt"),
    ({"load": {**BASE["load"], "arrival_pattern": "batched"}}, "load.arrival_pattern"),
    ({"load": {**BASE["load"], "retry_after_529": -1}}, "load.retry_after_529"),
    ({"timeline": [{"at": 1, "fault": {"kind": "melt"}}]},
     "timeline[0].fault.kind: expected one of stall, slow, crash, errors, clear, got 'melt'"),
    ({"timeline": [{"at": 1, "fault": {"kind": "stall"}}]}, "timeline[0].fault.seconds"),
    ({"timeline": [{"at": 1, "fault": {"kind": "slow", "factor": 0}}]},
     "timeline[0].fault.factor: expected a number (step times x factor) in (0, 1000]"),
    ({"timeline": [{"at": 1, "fault": {"kind": "crash", "seconds": 2}}]},
     "timeline[0].fault.seconds: unknown key (known keys: kind, replica)"),
    ({"timeline": [{"at": 1, "fault": {"kind": "errors", "types": ["teapot"]}}]},
     "timeline[0].fault.types: expected a non-empty list of error types (rate_limit,"),
    ({"timeline": [{"at": 1, "fault": {"kind": "errors", "rate": 1.5}}]},
     "timeline[0].fault.rate: expected a probability in [0, 1]"),
    ({"timeline": [{"at": 1, "fault": {"kind": "errors", "script": [{"error": "ok", "count": 0}]}}]},
     "timeline[0].fault.script[0].count"),
    ({"timeline": [{"at": 1, "fault": {"kind": "errors"}}]}, "timeline[0].fault.rate: expected one or more"),
    ({"server": {"kv_offloading_size": 0}}, "server.kv_offloading_size: expected a number of GiB > 0"),
])
def test_bad_scenarios_are_refused_naming_the_key(change, key):
    with pytest.raises(ConfigError) as err:
        parse_scenario({**BASE, **change}, "s.toml")
    assert str(err.value).startswith("s.toml: ") and key in str(err.value)


def test_settle_is_the_time_after_which_the_limit_stays_in_its_band():
    # limit 40 until 2 s, then 20 from 2 s on: the band around 20 is +-4.
    ctl = {"t": np.array([0.0, 2.0]), "limit": np.array([40.0, 20.0])}
    assert settle_seconds(ctl, 0.0, 10.0, 16, 24) == pytest.approx(2.0, abs=0.06)
    assert settle_seconds(ctl, 3.0, 10.0, 16, 24) == 0.0
    assert settle_seconds(ctl, 0.0, 10.0, 30, 50) is None  # never back in the band
    # A dip of 0.5 s out of the band in the last 8 s (6 %) is tolerated, not one of 2 s.
    dip = {"t": np.array([0.0, 2.0, 5.0, 5.5]), "limit": np.array([40.0, 20.0, 10.0, 20.0])}
    assert settle_seconds(dip, 0.0, 10.0, 16, 24) == pytest.approx(2.0, abs=0.06)
    long_dip = {"t": np.array([0.0, 2.0, 5.0, 7.0]), "limit": np.array([40.0, 20.0, 10.0, 20.0])}
    assert settle_seconds(long_dip, 0.0, 10.0, 16, 24) == pytest.approx(7.0, abs=0.06)
    grid, values = step_series(ctl["t"], ctl["limit"], 1.0, 3.0, step=1.0)
    assert list(values) == [40.0, 20.0]


def test_a_fault_with_seconds_ends_in_its_own_phase_and_the_oracle_knows_what_it_models():
    sc = parse_scenario({**BASE, "duration": 30, "timeline": [
        {"at": 5, "fault": {"kind": "slow", "factor": 3, "seconds": 10}},
        {"at": 8, "fault": {"kind": "errors", "rate": 0.1, "types": ["overloaded"]}},
        {"at": 20, "fault": {"kind": "clear"}},
        {"at": 22, "fault": {"kind": "stall", "seconds": 2}},
        {"at": 29, "fault": {"kind": "stall", "seconds": 5}}]}, "s.toml")  # ends after the run
    assert [a.describe() for a in sc.timeline] == [
        "slow x3 for 10 s", "errors 10 % overloaded", "slow x3 for 10 s ends", "clear faults",
        "stall 2 s", "stall 2 s ends", "stall 5 s"]
    assert [(p.start, p.fault, p.slowdown, p.fault_modelled) for p in sc.phases()] == [
        (0, "", 1.0, True), (5, "slow x3", 3.0, True),
        (8, "slow x3, errors 10 % overloaded", 3.0, False), (15, "errors 10 % overloaded", 1.0, False),
        (20, "", 1.0, True), (22, "stall 2 s", 1.0, False), (24, "", 1.0, True),
        (29, "stall 5 s", 1.0, False)]


@pytest.mark.parametrize("name, autoscaler, replicas, pattern", [
    ("autoscaling-diurnal", "hpa", 2, "poisson"), ("autoscaling-spike", "keda", 1, "poisson"),
    ("autoscaling-ramp", "slo", 1, "poisson"), ("autoscaling-trace", "hpa", 1, "trace")])
def test_the_shipped_autoscaling_scenarios_load(name, autoscaler, replicas, pattern):
    sc = load_scenario(ROOT / "configs" / "experiments" / f"{name}.toml")
    assert (sc.autoscaler, sc.fleet.replicas, sc.workload.arrival_pattern) == (autoscaler, replicas, pattern)
    assert sc.slo.ttft_s and sc.fleet.max_replicas >= 4 and sc.config.is_file()


def test_a_fleet_and_its_autoscaler_and_slo_read_with_their_defaults():
    sc = parse_scenario({**BASE, "autoscaler": {"name": "hpa"}, "slo": {"e2e_s": 9},
                         "timeline": [{"at": 2, "replicas": 3}]}, "s.toml")
    fleet = sc.fleet  # an autoscaler alone makes a fleet, with the defaults
    assert (fleet.replicas, fleet.max_replicas, fleet.startup_delay, fleet.metrics_interval) == (1, 16, "auto", 15.0)
    assert (sc.slo.ttft_s, sc.slo.e2e_s, sc.slo.attainment, sc.slo.window) == (None, 9.0, 0.99, 300.0)
    assert sc.timeline[0].replicas == 3 and sc.timeline[0].describe() == "replicas=3"


@pytest.mark.parametrize("change, key", [
    ({"fleet": {"max_replicas": 65}}, "fleet.max_replicas: expected an integer in [1, 64]"),
    ({"fleet": {"replicas": 5, "max_replicas": 4}}, "fleet.replicas: expected an integer in [0, max_replicas = 4]"),
    ({"fleet": {"startup_delay": "soon"}}, 'fleet.startup_delay: expected "auto" or a number'),
    ({"fleet": {"metrics_interval": 0}}, "fleet.metrics_interval"),
    ({"fleet": {}, "slo": {"attainment": 0.9}}, "slo.ttft_s: expected ttft_s and/or e2e_s"),
    ({"autoscaler": {"params": {}}}, "autoscaler.name: missing"),
    ({"autoscaler": {"name": "hpa", "params": 3}}, "autoscaler.params: expected a table"),
    ({"timeline": [{"at": 1, "replicas": 2}]}, "timeline: a `replicas` action needs a [fleet] table"),
    ({"timeline": [{"at": 1, "replicas": 99}], "fleet": {}}, "timeline[0].replicas: expected an integer in [0, 64]"),
    ({"scrape_interval": 0}, "scrape_interval"),
])
def test_bad_fleet_tables_are_refused_naming_the_key(change, key):
    with pytest.raises(ConfigError) as err:
        parse_scenario({**BASE, **change}, "s.toml")
    assert str(err.value).startswith("s.toml: ") and key in str(err.value)


def test_a_trace_load_is_found_beside_the_scenario_and_refuses_load_actions(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n1,ChatGPT,5,6,11,API log\n")
    doc = {"duration": 5, "load": {"arrival_pattern": "trace", "trace_path": "t.csv", "trace_format": "burstgpt"}}
    sc = parse_scenario(doc, "s.toml", base=tmp_path)
    assert sc.workload.trace_path == str(trace) and len(sc.workload.trace()) == 1
    with pytest.raises(ConfigError, match="a trace sets the load itself"):
        parse_scenario({**doc, "timeline": [{"at": 1, "load": {"arrival_rate": 3}}]}, "s.toml", base=tmp_path)
    trace.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n1,ChatGPT,5\n")
    with pytest.raises(ConfigError) as err:
        parse_scenario(doc, "s.toml", base=tmp_path)
    assert err.value.path == "load.trace_path" and "line 2: 3 fields; the header has 6" in err.value.message


def test_the_shipped_pd_scenario_sweeps_three_ratios_on_four_replicas():
    sc = load_scenario(ROOT / "configs" / "experiments" / "pd-ratio.toml")
    assert sc.ratios == ((1, 3), (2, 2), (3, 1)) and sc.pd is None  # a sweep: no single layout
    assert (sc.fleet.replicas, sc.fleet.pd_policy, sc.autoscaler) == (4, "least_loaded", "")
    one = sc.with_ratio((2, 2))
    assert one.pd == (2, 2) and one.ratios == ((2, 2),) and one.fleet.replicas == 4
    assert sc.config.is_file() and sc.duration * len(sc.ratios) / sc.time_scale <= 20  # wall seconds of load


def test_kv_roles_read_one_ratio_or_a_list_and_set_the_replicas():
    sc = parse_scenario({**BASE, "fleet": {"kv_roles": "1:2"}}, "s.toml")
    assert (sc.pd, sc.fleet.replicas, sc.fleet.pd_policy) == ((1, 2), 3, "least_loaded")
    sc = parse_scenario({**BASE, "fleet": {"kv_roles": ["1:4", "3:2"], "pd_policy": "round_robin"}}, "s.toml")
    assert (sc.ratios, sc.pd, sc.fleet.replicas, sc.fleet.pd_policy) == (((1, 4), (3, 2)), None, 5, "round_robin")
    assert parse_scenario({**BASE, "fleet": {"replicas": 2}}, "s.toml").ratios == ()


@pytest.mark.parametrize("change, key", [
    ({"fleet": {"kv_roles": "1-3"}}, 'fleet.kv_roles: expected "P:D"'),
    ({"fleet": {"kv_roles": "0:4"}}, 'fleet.kv_roles: expected "P:D"'),
    ({"fleet": {"kv_roles": []}}, 'fleet.kv_roles: expected "P:D"'),
    ({"fleet": {"kv_roles": 3}}, 'fleet.kv_roles: expected "P:D"'),
    ({"fleet": {"kv_roles": ["1:3", "1:2"]}}, "all adding up to the same number of replicas"),
    ({"fleet": {"kv_roles": ["1:3", "1:3"]}}, "none repeated"),
    ({"fleet": {"replicas": 3, "kv_roles": "2:2"}}, "(replicas = 3)"),
    ({"fleet": {"kv_roles": "1:1", "pd_policy": "random"}}, "fleet.pd_policy: expected one of least_loaded, round_robin"),
    ({"fleet": {"kv_roles": "1:1"}, "autoscaler": {"name": "hpa"}}, "fleet.kv_roles: a P/D fleet runs without an [autoscaler]"),
    ({"fleet": {"kv_roles": "1:1"}, "timeline": [{"at": 1, "replicas": 3}]}, "fleet.kv_roles: a P/D fleet keeps its replicas"),
    ({"fleet": {"kv_roles": "1:1"}, "load": {"arrival_pattern": "closed_loop", "num_concurrent_users": 4,
                                                   "input_len_dist": {"type": "fixed", "value": 8},
                                                   "pooling": True}},
     "fleet.kv_roles: a P/D fleet serves completions, not a pooling load"),
])
def test_bad_kv_roles_are_refused_naming_the_key(change, key):
    with pytest.raises(ConfigError) as err:
        parse_scenario({**BASE, **change}, "s.toml")
    assert str(err.value).startswith("s.toml: ") and key in str(err.value)


def test_virtual_time_refuses_a_pd_fleet_naming_the_key(tmp_path):
    from inference_lab.experiments.experiment import run_virtual

    sc = parse_scenario({**BASE, "fleet": {"kv_roles": "1:1"}}, "s.toml")
    with pytest.raises(ValueError, match="s.toml: fleet.kv_roles: virtual time does not model a P/D fleet"):
        run_virtual(sc, tmp_path / "out")
    assert not (tmp_path / "out").exists()
