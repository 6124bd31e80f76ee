"""The fitter's answers on the calibrate tests' fixtures, pinned to 1e-9: the linear
algebra under the search (numpy's least squares and SVD) may change how it computes a
step, never where the search ends, which parameters it drops, or why. The pinned
answers are the search's own, without the prior that holds parameters near their start
(prior=0; tests/core/test_fit_prior.py covers the prior).

The measurements are those of tests/e2e/test_calibrate_cli.py: a llama-3.1-8b engine on
the reference h100 (tests/factories.py) with three costs changed, 10 x c requests of 2048 / 64 tokens,
concurrency 32 held out."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from inference_lab.calibrate.fitting import (PARAMETERS, Evaluator, fit, identify,
                                             leave_largest_out, leave_one_out)
from factories import REFERENCE_CALIBRATION, calibrate_points

TRUTH = replace(REFERENCE_CALIBRATION, bandwidth_efficiency=0.6,
                step_overhead=3e-3, request_overhead=10e-3)
START = REFERENCE_CALIBRATION


@pytest.fixture(scope="module")
def evaluator() -> Evaluator:
    return Evaluator(calibrate_points(TRUTH))


def fitted(cal, names) -> dict[str, float]:
    return {name: getattr(cal, name) for name in names}


THREE = ["bandwidth_efficiency", "step_overhead", "request_overhead"]
# The fitter's answers on these points.
THREE_FITTED = {"bandwidth_efficiency": 0.5971669174616896, "step_overhead": 0.00295,
                "request_overhead": 0.010849407282458041}
LOO = {0: {"ttft_ms": 0.009589421930714437, "tpot_ms": -0.0005852918101509896},
       1: {"ttft_ms": -4.455553272342261e-05, "tpot_ms": -0.0011966852493329183},
       2: {"ttft_ms": -0.00020060062722693228, "tpot_ms": 0.0003929297089027006}}
LARGEST = {2: LOO[2]}
ALL_FITTED = {
    "bandwidth_efficiency": 0.988, "flops_efficiency": 0.5429534628187432,
    "moe_flops_efficiency": 0.0998, "flops_half_tokens": 0.0, "comm_efficiency": 0.672,
    "step_overhead": 0.00295, "layer_overhead": 8.478374453431134e-05,
    "expert_overhead": 2.22e-08, "mla_layer_overhead": 0.0,
    "sequence_overhead": 0.0002101633470950527, "sequence_kernel_overhead": 0.0,
    "mixed_step_overhead": 0.0, "unoverlapped_fraction": 0.0, "routing_skew": 0.0,
    "request_overhead": 0.03618408766576982, "prompt_token_overhead": 4.75e-06,
}
NO_EFFECT = "no effect on any measured metric of these points"
ALL_DROPPED = {
    "comm_efficiency": "no point runs on more than one GPU",
    "moe_flops_efficiency": "no point serves an MoE model",
    "expert_overhead": "no point serves an MoE model",
    "mla_layer_overhead": "no point serves an MLA model",
    "sequence_kernel_overhead": NO_EFFECT, "mixed_step_overhead": NO_EFFECT,
    "unoverlapped_fraction": NO_EFFECT, "routing_skew": NO_EFFECT,
    "step_overhead": "its effect on these points is explained by layer_overhead, bandwidth_efficiency",
    "prompt_token_overhead": "its effect on these points is explained by request_overhead",
    "bandwidth_efficiency": "its effect on these points is explained by layer_overhead",
}


def test_a_fit_of_three_costs_ends_where_it_always_has(evaluator):
    result = fit(evaluator, START, THREE, [0, 1, 2], prior=0.0)
    assert result.fitted == ["bandwidth_efficiency", "request_overhead"]
    assert result.undetermined == {
        "step_overhead": "its effect on these points is explained by bandwidth_efficiency"}
    assert fitted(result.calibration, THREE) == pytest.approx(THREE_FITTED, rel=1e-9)
    loo = leave_one_out(evaluator, result, [0, 1, 2])
    assert loo == {i: pytest.approx(errors, rel=1e-9) for i, errors in LOO.items()}
    largest = leave_largest_out(evaluator, result, [0, 1, 2], loo)
    assert largest == {i: pytest.approx(errors, rel=1e-9) for i, errors in LARGEST.items()}


# every parameter but the decode attention's KV bandwidth, the per-stream host time, the
# collectives' own bandwidth fraction and the 4-bit experts' floor, which these answers predate
EVERY = [p for p in PARAMETERS
         if p not in ("kv_bandwidth_efficiency", "stream_overhead", "comm_bandwidth_efficiency",
                      "fp4_expert_overhead")]


def test_a_fit_of_every_parameter_drops_the_same_ones_for_the_same_reasons(evaluator):
    result = fit(evaluator, START, EVERY, [0, 1, 2], max_iter=4, prior=0.0)
    assert result.undetermined == ALL_DROPPED
    assert fitted(result.calibration, EVERY) == pytest.approx(ALL_FITTED, rel=1e-9)


def test_identify_drops_the_column_the_others_explain_and_names_them():
    # d log(metric) / d log(p) of three parameters over four metrics: the third is nearly
    # the sum of the first two, so it goes, leaning on both (a's column the heavier).
    a, b = [1.0, 0.2, 0.0, 0.5], [0.0, 0.9, 0.3, 0.1]
    c = list(np.add(a, b) + [1e-4, -1e-4, 0.0, 2e-4])
    keep, why = identify(["a", "b", "c"], [a, b, c], rows=4)
    assert keep == ["a", "b"]
    assert why == {"c": "its effect on these points is explained by a, b"}
