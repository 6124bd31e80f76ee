"""Workload files: parsing, length distributions, open-loop arrival times, refusals."""

from __future__ import annotations

import random
import statistics
from itertools import pairwise
from pathlib import Path

import pytest

from inference_lab.common.toml import ConfigError
from inference_lab.common.workload import LengthDist, WorkloadSpec, load_workload, open_loop_arrivals

WORKLOADS = Path(__file__).resolve().parents[2] / "configs" / "workloads"

POISSON = """\
[workload]
arrival_pattern = "poisson"
arrival_rate = 50.0
num_requests = 2000
seed = 7
input_len_dist = { type = "uniform", min = 10, max = 20 }
output_len_dist = { type = "fixed", value = 5 }
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "w.toml"
    path.write_text(text)
    return path


def spec(pattern: str = "poisson", **kw) -> WorkloadSpec:
    fixed = LengthDist("fixed", value=10)
    return WorkloadSpec(arrival_pattern=pattern, num_requests=kw.pop("num_requests", 10),
                        input_len_dist=fixed, output_len_dist=fixed, **kw)


def test_the_shipped_closed_loop_workload_is_the_reference_experiment():
    w = load_workload(WORKLOADS / "chat-closed-loop-24.toml")
    assert (w.arrival_pattern, w.num_concurrent_users, w.num_requests, w.seed) == ("closed_loop", 24, 500, 1)
    assert w.input_len_dist == LengthDist("fixed", value=16)
    assert w.output_len_dist == LengthDist("fixed", value=200)


def test_the_shipped_open_loop_and_large_closed_loop_workloads_load():
    poisson = load_workload(WORKLOADS / "poisson-chat.toml")
    assert (poisson.arrival_pattern, poisson.arrival_rate, poisson.num_requests) == ("poisson", 20.0, 1000)
    assert poisson.input_len_dist.type == poisson.output_len_dist.type == "lognormal"
    big = load_workload(WORKLOADS / "chat-closed-loop-256.toml")
    assert (big.num_concurrent_users, big.num_requests) == (256, 100_000)
    assert (big.input_len_dist.mean, big.input_len_dist.std_dev) == (5.5, 0.5)
    assert (big.output_len_dist.mean, big.output_len_dist.std_dev) == (5.3, 0.5)


def test_workload_keys_may_sit_at_the_top_level(tmp_path):
    top = load_workload(write(tmp_path, POISSON.replace("[workload]\n", "")))
    assert top == load_workload(write(tmp_path, POISSON))
    assert (top.seed, top.batch_size, top.batch_interval) == (7, None, 1.0)


def test_the_other_sections_of_an_inference_lab_file_are_ignored_beside_workload(tmp_path):
    w = load_workload(write(tmp_path, "[simulation]\nlog = 1\n" + POISSON))
    assert w.arrival_rate == 50.0


@pytest.mark.parametrize(("dist", "low", "high"), [
    (LengthDist("fixed", value=16), 16, 16),
    (LengthDist("uniform", min=10, max=20), 10, 20),
    (LengthDist("normal", mean=100, std_dev=30), 1, 1000),
    (LengthDist("lognormal", mean=5.5, std_dev=0.5), 1, 10_000),
])
def test_each_length_dist_samples_ints_in_range_and_repeats_for_a_seed(dist, low, high):
    def draw(seed: int) -> list[int]:
        rng = random.Random(seed)
        return [dist.sample(rng) for _ in range(500)]

    assert draw(3) == draw(3)
    assert all(isinstance(x, int) and low <= x <= high for x in draw(3))
    assert (draw(3) != draw(4)) == (dist.type != "fixed")


def test_uniform_lengths_cover_both_ends():
    rng = random.Random(0)
    assert {LengthDist("uniform", min=1, max=3).sample(rng) for _ in range(200)} == {1, 2, 3}


def test_normal_and_lognormal_lengths_have_the_configured_centre():
    rng = random.Random(1)
    normal = [LengthDist("normal", mean=100, std_dev=10).sample(rng) for _ in range(4000)]
    assert statistics.mean(normal) == pytest.approx(100, abs=1)
    lognormal = [LengthDist("lognormal", mean=5.5, std_dev=0.5).sample(rng) for _ in range(4000)]
    assert statistics.median(lognormal) == pytest.approx(245, rel=0.05)  # e^5.5 = 244.7


def test_lengths_are_never_below_one():
    rng = random.Random(2)
    assert min(LengthDist("normal", mean=0, std_dev=5).sample(rng) for _ in range(500)) == 1


def test_poisson_arrivals_are_increasing_at_the_rate_and_repeat_for_a_seed(tmp_path):
    w = load_workload(write(tmp_path, POISSON))
    arrivals = list(open_loop_arrivals(w))
    assert len(arrivals) == 2000 and arrivals == list(open_loop_arrivals(w, random.Random(7)))
    times = [t for t, *_ in arrivals]
    assert all(a < b for a, b in pairwise(times))
    assert times[-1] / len(times) == pytest.approx(1 / 50, rel=0.1)
    assert {out for _, _, out, _ in arrivals} == {5}
    assert {p for _, p, _, _ in arrivals} == set(range(10, 21))


def test_a_different_seed_gives_different_arrivals(tmp_path):
    w = load_workload(write(tmp_path, POISSON))
    assert list(open_loop_arrivals(w, random.Random(1))) != list(open_loop_arrivals(w, random.Random(2)))


def test_uniform_arrivals_come_every_one_over_rate_seconds():
    times = [t for t, *_ in open_loop_arrivals(spec("uniform", arrival_rate=4.0, num_requests=4))]
    assert times == [0.25, 0.5, 0.75, 1.0]


def test_batched_arrivals_come_in_bursts_of_batch_size_every_interval():
    w = spec("batched", num_requests=5, batch_size=2, batch_interval=0.5)
    assert [t for t, *_ in open_loop_arrivals(w)] == [0.0, 0.0, 0.5, 0.5, 1.0]


def test_batched_arrivals_default_to_one_burst_at_time_zero():
    assert {t for t, *_ in open_loop_arrivals(spec("batched", num_requests=7))} == {0.0}


def test_closed_loop_has_no_open_loop_arrivals():
    with pytest.raises(ValueError, match="closed_loop"):
        next(open_loop_arrivals(spec("closed_loop", num_concurrent_users=2)))


@pytest.mark.parametrize(("change", "message"), [
    (('"poisson"', '"bursty"'),
     "workload.arrival_pattern: expected one of poisson, uniform, fixed_rate, burst, batched, closed_loop, trace, got 'bursty'"),
    (("arrival_rate = 50.0", "arrival_rate = 0"), "workload.arrival_rate: expected a number > 0 (requests per second), got 0"),
    (("num_requests = 2000", "num_requests = true"), "workload.num_requests: expected an integer >= 1, got True"),
    (("num_requests = 2000", "num_requests = 0"), "workload.num_requests: expected an integer >= 1, got 0"),
    (("seed = 7", "sead = 7"), "workload.sead: unknown key (known keys: arrival_pattern, "),
    (("min = 10, max = 20", "min = 10, max = 5"), "workload.input_len_dist.max: expected an integer >= min (10), got 5"),
    (('type = "fixed"', 'type = "zipf"'), "workload.output_len_dist.type: expected one of fixed, uniform, normal, lognormal, got 'zipf'"),
    (("value = 5", "value = 5, min = 1"), "workload.output_len_dist.min: unknown key (known keys: type, value)"),
    (('{ type = "fixed", value = 5 }', '{ type = "normal", mean = 5, std_dev = -1 }'),
     "workload.output_len_dist.std_dev: expected a number >= 0, got -1"),
    (('{ type = "fixed", value = 5 }', '{ type = "lognormal", mean = 200, std_dev = 1 }'),
     "workload.output_len_dist.mean: expected the mean of the log of the length"),
    (('output_len_dist = { type = "fixed", value = 5 }\n', ""), "workload.output_len_dist: missing; expected a table"),
    (("[workload]", "[workload]\n[extra]"), "extra: unknown key"),
    (('"poisson"', '"closed_loop"'), "workload.num_concurrent_users: missing; expected an integer >= 1"),
])
def test_a_bad_workload_is_refused_with_the_file_and_key_path(tmp_path, change, message):
    path = write(tmp_path, POISSON.replace(*change))
    with pytest.raises(ConfigError) as info:
        load_workload(path)
    assert str(info.value).startswith(f"{path}: {message}")


def test_a_workload_with_bad_toml_is_refused_with_the_file(tmp_path):
    path = write(tmp_path, "[workload\n")
    with pytest.raises(ConfigError, match=r"w\.toml: invalid TOML"):
        load_workload(path)


def test_a_pooling_workload_draws_no_output_and_the_simulator_counts_none(tmp_path):
    from inference_lab.engine.drivers.offline import run_offline
    from inference_lab.engine.sim.config import load_deployment

    spec = load_workload(WORKLOADS / "embeddings-poisson.toml")
    assert spec.pooling and all(out == 0 for _, _, out, _ in open_loop_arrivals(spec))
    small = load_workload(write(tmp_path, POISSON.replace("num_requests = 2000", "num_requests = 50")
                                .replace('output_len_dist = { type = "fixed", value = 5 }\n', "")
                                + "pooling = true\n"))
    deployment = load_deployment(Path(__file__).resolve().parents[2] / "configs" / "bge-base-en-v1.5.toml", "b200")
    summary = run_offline(deployment, small)
    assert summary["requests"]["completed"] == 50
    assert summary["throughput_metrics"]["output_tokens_per_sec"] == 0
    with pytest.raises(ConfigError, match="output_len_dist.*pooling workload generates nothing"):
        load_workload(write(tmp_path, POISSON + "pooling = true\n"))
