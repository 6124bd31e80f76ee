"""The fit's prior: each moved parameter pays for its distance from where it started
(a Cauchy loss in log scale), so that a few points do not move parameters along a
direction they cannot tell apart, while a move the points ask for is still made.

The points are those of tests/core/test_fitting_answers.py: a llama-3.1-8b engine on the
reference h100 (tests/factories.py) with three costs changed (the truth), 10 x c requests
of 2048 / 64 tokens at 1, 8 and 64 clients."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from inference_lab.calibrate.fitting import (PARAMETERS, PRIOR, Evaluator, fit, leave_one_out,
                                             prior_cost, prior_weights)
from inference_lab.cli.cmd_calibrate import DEFAULT_FIT
from factories import REFERENCE_CALIBRATION, calibrate_points

TRUTH = replace(REFERENCE_CALIBRATION, bandwidth_efficiency=0.6,
                step_overhead=3e-3, request_overhead=10e-3)
START = REFERENCE_CALIBRATION


def error_equivalent(move: float, weight: float = PRIOR) -> float:
    """The one-value relative error whose cost the prior charges for this move."""
    return math.expm1(math.sqrt(prior_cost(np.array([move]), weight)))


def test_the_prior_prices_a_doubling_as_a_five_percent_error_and_a_tenfold_move_as_nine():
    assert prior_cost(np.zeros(3), PRIOR) == 0.0
    assert error_equivalent(math.log(2)) == pytest.approx(0.053, abs=0.001)
    assert error_equivalent(-math.log(2)) == error_equivalent(math.log(2))
    assert error_equivalent(math.log(10)) == pytest.approx(0.092, abs=0.001)
    # near the start it is the quadratic weight**2 * move**2; far out it grows as a log
    assert prior_cost(np.array([0.01]), PRIOR) == pytest.approx(PRIOR ** 2 * 1e-4, rel=1e-3)
    assert prior_cost(np.array([4.0]), PRIOR) < 0.1 * PRIOR ** 2 * 16
    assert prior_cost(np.array([0.3, 0.4]), 0.0) == 0.0


@pytest.mark.parametrize("move", [-2.0, -0.4, 0.05, 0.5, 3.0])
def test_the_prior_weights_in_the_normal_equations_are_its_costs_gradient(move):
    h = 1e-6
    numeric = (prior_cost(np.array([move + h]), PRIOR) - prior_cost(np.array([move - h]), PRIOR)) / (2 * h)
    assert 2 * prior_weights(np.array([move]), PRIOR)[0] * move == pytest.approx(numeric, rel=1e-6)


@pytest.fixture(scope="module")
def evaluator() -> Evaluator:
    return Evaluator(calibrate_points(TRUTH))


THREE = ["bandwidth_efficiency", "step_overhead", "request_overhead"]


def test_a_move_the_points_ask_for_is_made_with_the_prior_on(evaluator):
    # the start is 0.988 of the HBM peak and 21 ms per request; the truth 0.6 and 10 ms
    result = fit(evaluator, START, THREE, [0, 1, 2])
    assert result.prior == PRIOR and result.center == START
    assert result.calibration.bandwidth_efficiency == pytest.approx(0.6, rel=0.01)
    assert result.calibration.request_overhead == pytest.approx(10e-3, rel=0.1)
    assert result.mean_abs_error < 0.01
    # a prior many times stronger holds the parameters visibly short of the truth
    held = fit(evaluator, START, THREE, [0, 1, 2], prior=3.0)
    assert held.calibration.bandwidth_efficiency > 0.62
    assert held.mean_abs_error > 2 * result.mean_abs_error


def test_the_prior_shortens_every_move_made_to_chase_noise():
    # Points of the start's own engine, each measured value off by 3 % (a fixed pattern):
    # nothing should move. Without the prior the search moves every parameter it keeps
    # to chase the noise; with it, each moves less, for an error on the points hardly
    # larger.
    ev = Evaluator(calibrate_points(START, noise=[0.03, -0.03, -0.03, 0.03, 0.03, -0.03]))
    free = fit(ev, START, DEFAULT_FIT, [0, 1, 2], prior=0.0)
    held = fit(ev, START, DEFAULT_FIT, [0, 1, 2])
    assert held.fitted == free.fitted and len(free.fitted) >= 3

    def moves(cal):
        return {n: abs(PARAMETERS[n].to_x(getattr(cal, n)) - PARAMETERS[n].to_x(getattr(START, n)))
                for n in free.fitted}

    m_free, m_held = moves(free.calibration), moves(held.calibration)
    assert sum(m_free.values()) > 0.2
    assert all(m_held[n] <= m_free[n] for n in free.fitted)
    assert sum(m_held.values()) < 0.5 * sum(m_free.values())
    assert held.mean_abs_error <= free.mean_abs_error + 0.002


def test_leave_one_out_refits_are_held_near_the_fits_own_start(evaluator):
    result = fit(evaluator, START, THREE, [0, 1, 2])
    loo = leave_one_out(evaluator, result, [0, 1, 2])
    assert set(loo) == {0, 1, 2}
    # each refit is the full fit's objective without the point: the same prior, centred
    # on the same start (not on the full fit, which saw the point)
    for i in (0, 2):
        rest = [j for j in (0, 1, 2) if j != i]
        refit = fit(evaluator, result.calibration, result.fitted, rest, 3, check=False, center=START)
        sim = evaluator.sims([refit.calibration], [i])[0][0]
        expected = {k: sim[k] / v - 1 for k, v in evaluator.points[i].measured.items()}
        assert loo[i] == pytest.approx(expected, rel=1e-12)
        unheld = fit(evaluator, result.calibration, result.fitted, rest, 3, check=False,
                     center=result.calibration)
        assert unheld.calibration != refit.calibration


def test_an_unset_four_bit_floor_starts_and_is_held_at_the_floor_it_stands_for():
    # gpt-oss-20b's experts are fp4; the start leaves their floor unset (as expert_overhead,
    # 2 us). Points of that engine itself: the fit starts from 2 us, its prior is centred
    # there (given as the centre too, unset), and nothing moves it.
    from factories import deployment
    from inference_lab.calibrate.simulate import Point, simulate
    from inference_lab.engine.sim.specs import Calibration

    cal = Calibration(bandwidth_efficiency=0.7, flops_efficiency=0.5, expert_overhead=2e-6)
    dep = deployment("gpt-oss-20b", "b200")
    dep = replace(dep, timing="calibrated", hardware=replace(dep.hardware, calibration=cal))
    points = []
    for c in (1, 8):
        point = Point(f"c={c}", dep, c, 256, 32, {"tpot_ms": 1.0}, requests=4 * c)
        points.append(replace(point, measured={"tpot_ms": simulate(point, cal)["tpot_ms"]}))
    result = fit(Evaluator(points), cal, ["fp4_expert_overhead"], [0, 1], max_iter=2,
                 check=False, center=cal)
    assert result.center.fp4_expert_overhead == 2e-6
    assert result.calibration.fp4_expert_overhead == pytest.approx(2e-6, rel=1e-9)
    assert result.mean_abs_error < 1e-9


def test_an_unset_kv_bandwidth_starts_and_is_held_at_the_bandwidth_it_stands_for():
    # the reference engine leaves the KV read's fraction unset (as bandwidth_efficiency,
    # 0.988); points of that engine itself: a fit of the key starts at 0.988, not at the
    # key's lower bound (0.05, a KV read twenty times slower), and nothing moves it
    points = Evaluator(calibrate_points(REFERENCE_CALIBRATION))
    result = fit(points, REFERENCE_CALIBRATION, ["kv_bandwidth_efficiency"], [0, 1, 2], max_iter=2,
                 check=False)
    assert result.center.kv_bandwidth_efficiency == pytest.approx(0.988, rel=1e-12)
    assert result.calibration.kv_bandwidth_efficiency == pytest.approx(0.988, rel=1e-9)
    assert result.mean_abs_error < 1e-4
