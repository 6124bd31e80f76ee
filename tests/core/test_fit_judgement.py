"""A fit judged by its own errors: the mean error by hand, and each input mistake that
leaves a signature in the fitted errors named with what to change. Points and their
fitted metrics are written by hand: nothing is simulated."""

from __future__ import annotations

import pytest
from factories import deployment

from inference_lab.calibrate.judgement import fit_error, likely_causes
from inference_lab.calibrate.simulate import Point

DEP = deployment()


def point(c: int, ttft: float, tpot: float, median: bool = False, ratio: float = 1.0) -> Point:
    return Point(f"c={c} 1000/100", DEP, c, 1000, 100,
                 {"ttft_p50_ms" if median else "ttft_ms": ttft, "tpot_ms": tpot}, range_ratio=ratio)


def fitted(p: Point, ttft_error: float, tpot_error: float) -> dict[str, float]:
    """The metrics a fit gives for `p`: its measured ones times 1 + the error."""
    ttft = "ttft_p50_ms" if "ttft_p50_ms" in p.measured else "ttft_ms"
    return {ttft: p.measured[ttft] * (1 + ttft_error), "tpot_ms": p.measured["tpot_ms"] * (1 + tpot_error)}


def judged(errors, **kw) -> tuple[float, list[str]]:
    points = [point(c, 100.0, 10.0, **kw) for c, _, _ in errors]
    sims = [fitted(p, a, b) for p, (_, a, b) in zip(points, errors)]
    return fit_error(points, sims), likely_causes(points, sims, 0.25)


def test_the_fit_error_is_the_mean_of_every_metrics_relative_error():
    # |+0.1| + |-0.3| + |0| + |+0.2| over 4 metrics = 0.15
    error, _ = judged([(4, 0.1, -0.3), (16, 0.0, 0.2)])
    assert error == pytest.approx(0.15)


def test_ttft_high_under_load_with_a_tpot_that_fits_names_the_median_column_and_the_range_ratio():
    # one client never queues: its TTFT error does not count against the pattern
    _, causes = judged([(1, -0.05, 0.02), (8, 0.9, -0.05), (32, 2.0, 0.05)])
    assert len(causes) == 2
    assert causes[0].startswith("TTFT given as means (ttft_ms) that behave as medians")
    assert "(+90% to +200%)" in causes[0] and "put them in the ttft_p50_ms column" in causes[0]
    assert causes[1].startswith("lengths taken as exact (--range-ratio 1)") and "--range-ratio R" in causes[1]


def test_medians_already_given_or_a_range_ratio_already_set_are_not_suggested():
    _, causes = judged([(8, 0.9, -0.05), (32, 2.0, 0.05)], median=True)
    assert [c.split(" (")[0] for c in causes] == ["lengths taken as exact"]
    _, causes = judged([(8, 0.9, -0.05), (32, 2.0, 0.05)], ratio=0.8)
    assert [c.split(" (")[0] for c in causes] == ["TTFT given as means"]
    _, causes = judged([(8, 0.9, -0.05), (32, 2.0, 0.05)], median=True, ratio=0.8)
    assert causes[0].startswith("none of the causes calibrate recognises")


def test_ttft_far_above_the_fit_at_the_lowest_concurrency_is_an_opening_burst():
    # measured 100 ms, fitted 40 ms: the fit is 60 % below at c=4
    _, causes = judged([(4, -0.6, 0.0), (16, -0.1, 0.05), (64, 0.05, -0.02)])
    assert causes == [
        "an opening burst or a cold start: at the lowest concurrency (c=4 1000/100) the measured TTFT "
        "100 ms is far above the fit's steady state (40 ms, -60%). First requests that pay "
        "compilation or CUDA-graph capture, or a burst of clients arriving at once, do this; warm "
        "the server up before measuring, give num_prompts if the run had other than 10 x the "
        "concurrency, or give the median TTFT (ttft_p50_ms)."]
    _, causes = judged([(4, -0.6, 0.0), (16, -0.1, 0.05)], median=True)
    assert causes[0].endswith("do this; warm the server up before measuring, or give num_prompts if "
                              "the run had other than 10 x the concurrency.")


def test_a_tpot_that_does_not_fit_points_at_the_server_settings():
    _, causes = judged([(4, 0.0, 0.5), (16, 0.05, 0.4)])
    assert len(causes) == 1 and causes[0].startswith("TPOT does not fit (mean |error| 45%)")
    assert "--kv-cache-dtype" in causes[0] and "--tp" in causes[0]


def plateau_points(tpots: list[float]) -> list[Point]:
    return [Point(f"c={c} 8000/1000", DEP, c, 8000, 1000, {"tpot_ms": t}, range_ratio=0.8)
            for c, t in zip((32, 64, 128, 256), tpots)]


def test_a_measured_tpot_that_stops_growing_where_the_fits_grows_names_the_memory_flags():
    # 64 -> 128 -> 256 clients: 30.9, 41.8, 41.8 ms measured (the server's cache full from
    # 128); the fit runs more sequences there: +24 % at 256
    points = plateau_points([21.1, 30.9, 41.8, 41.8])
    sims = [{"tpot_ms": p.measured["tpot_ms"] * (1 + e)} for p, e in zip(points, (0.0, 0.03, 0.2, 0.24))]
    causes = likely_causes(points, sims, 0.25)
    plateau = [c for c in causes if c.startswith("a KV cache smaller than the lab's")]
    assert len(plateau) == 1
    assert "from c=128 8000/1000 to c=256 8000/1000 (41.8 -> 41.8 ms)" in plateau[0]
    assert "+24% at c=256" in plateau[0] and "--kv-cache-memory-bytes" in plateau[0]


@pytest.mark.parametrize("tpots,errors", [
    ([21.1, 30.9, 41.8, 60.0], (0.0, 0.03, 0.2, 0.24)),  # still growing: no plateau
    ([21.1, 30.9, 41.8, 41.8], (0.0, 0.03, 0.05, 0.1)),  # flat, and so is the fit (within 12.5 %)
    ([21.1, 30.9, 41.8, 41.8], (0.3, 0.3, 0.3, 0.3)),  # the fit as far off below as in the plateau
])
def test_no_plateau_is_named_where_the_tpot_grows_or_the_fit_stays_flat_too(tpots, errors):
    points = plateau_points(tpots)
    sims = [{"tpot_ms": p.measured["tpot_ms"] * (1 + e)} for p, e in zip(points, errors)]
    assert not any(c.startswith("a KV cache smaller") for c in likely_causes(points, sims, 0.25))
