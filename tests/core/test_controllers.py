"""The reference controllers' published update rules, driven with synthetic outcomes."""

from __future__ import annotations

import math
import random

import pytest

from inference_lab.experiments.controllers import (
    AIMDLimit, EnvoyGradient, FixedLimit, Gradient2Limit, Outcome, SREThrottle, Ticket,
    VegasLimit, log10_root, make_controller)


def ticket(inflight: int, start: float = 0.0) -> Ticket:
    return Ticket(start, inflight)


def test_fixed_limit_admits_up_to_its_limit_and_frees_on_release():
    c = FixedLimit(2)
    a, b = c.acquire(0.0), c.acquire(0.0)
    assert a.inflight == 1 and b.inflight == 2
    assert c.acquire(0.0) is None
    c.release(a, 1.0, Outcome.DROPPED, 1.0)
    assert c.limit == 2 and c.inflight == 1
    assert c.acquire(1.0) is not None
    assert FixedLimit(0).limit == math.inf


def test_aimd_drop_multiplies_the_limit_by_the_backoff_ratio():
    c = AIMDLimit(initial_limit=100, min_limit=1)
    c.on_sample(ticket(100), 0.0, 0.1, dropped=True)
    assert c.limit == 90  # int(100 x 0.9)
    c.on_sample(ticket(90), 0.0, 0.1, dropped=True)
    assert c.limit == 81


def test_aimd_adds_one_per_fast_success_only_while_the_limit_is_used():
    c = AIMDLimit(initial_limit=30, min_limit=1)
    for _ in range(5):
        c.on_sample(ticket(15), 0.0, 0.1, dropped=False)  # 15 x 2 >= 30..: grows
    assert c.limit == 31  # 15 x 2 = 30 >= 30 grows once; 30 < 31 stops growth
    c.on_sample(ticket(31), 0.0, 0.1, dropped=False)
    assert c.limit == 32


def test_aimd_a_sample_slower_than_the_timeout_counts_as_a_drop():
    c = AIMDLimit(initial_limit=50, min_limit=1, timeout=5.0)
    c.on_sample(ticket(50), 0.0, 5.01, dropped=False)
    assert c.limit == 45


def test_aimd_published_defaults_and_bounds():
    c = AIMDLimit()
    assert (c.limit, c.min_limit, c.max_limit, c.backoff_ratio, c.timeout) == (20, 20, 200, 0.9, 5.0)
    c.on_sample(ticket(20), 0.0, 0.1, dropped=True)
    assert c.limit == 20  # clamped at min_limit
    c = AIMDLimit(initial_limit=200)
    c.on_sample(ticket(200), 0.0, 0.1, dropped=False)
    assert c.limit == 200  # clamped at max_limit
    with pytest.raises(ValueError, match="backoff_ratio"):
        AIMDLimit(backoff_ratio=0.4)


def test_log10_root_is_at_least_one():
    assert [log10_root(n) for n in (1, 9, 99, 100, 999, 1000, 12345)] == [1, 1, 1, 2, 2, 3, 4]


def test_vegas_grows_by_beta_without_queueing_and_shrinks_by_log10_on_a_drop():
    c = VegasLimit(initial_limit=20, probe_multiplier=10**9)
    c.on_sample(ticket(20), 0.0, 0.100, dropped=False)  # first sample: rtt_noload
    assert c.limit == 20 and c.rtt_noload == 0.100
    c.on_sample(ticket(20), 0.0, 0.101, dropped=False)  # queue = ceil(20 x 0.0099) = 1 <= 1
    assert c.limit == 26  # + beta = 6 x log10(20) = 6
    c.on_sample(ticket(26), 0.0, 0.101, dropped=True)
    assert c.limit == 25  # - log10(26) = 1


def test_vegas_backs_off_when_the_queue_estimate_exceeds_beta_and_holds_in_between():
    c = VegasLimit(initial_limit=100, probe_multiplier=10**9)
    c.on_sample(ticket(100), 0.0, 0.1, dropped=False)
    c.on_sample(ticket(100), 0.0, 0.2, dropped=False)  # queue = 50 > beta = 12
    assert c.limit == 98  # - log10(100) = 2
    # At 98: alpha = 3, beta = 6 (log10 rounds down to 1). queue = ceil(3.5) = 4 is in
    # [alpha, beta]: the sweet spot, unchanged.
    c.on_sample(ticket(98), 0.0, 0.1 / (1 - 3.5 / 98), dropped=False)
    assert c.limit == 98
    assert VegasLimit().max_concurrency == 1000


def test_vegas_does_not_grow_while_the_client_uses_under_half_of_its_limit():
    c = VegasLimit(initial_limit=20, probe_multiplier=10**9)
    c.on_sample(ticket(5), 0.0, 0.1, dropped=False)
    c.on_sample(ticket(5), 0.0, 0.1, dropped=False)
    assert c.limit == 20


def test_gradient2_holds_when_latency_is_steady_and_drops_when_it_doubles():
    c = Gradient2Limit(initial_limit=100, min_limit=1)
    for _ in range(20):
        c.on_sample(ticket(100), 0.0, 0.1, dropped=False)
    # gradient = min(1, 1.5 x 0.1 / 0.1) = 1: new = 100 + 4; smoothed 100 x 0.8 + 104 x 0.2
    assert c.limit >= 100
    before = c.estimated
    c.on_sample(ticket(100), 0.0, 1.0, dropped=False)  # long ~0.1, short 1.0: gradient 0.5
    expected = before * 0.8 + (before * 0.5 + 4) * 0.2
    assert c.estimated == pytest.approx(expected)
    assert Gradient2Limit().min_limit == 20 and Gradient2Limit().max_concurrency == 200


def test_gradient2_clamps_to_its_bounds_and_ignores_an_underused_limit():
    c = Gradient2Limit(initial_limit=20)
    c.on_sample(ticket(20), 0.0, 10.0, dropped=False)
    assert c.limit == 20  # min_limit 20 by default
    c = Gradient2Limit(initial_limit=50, min_limit=1)
    c.on_sample(ticket(10), 0.0, 10.0, dropped=False)  # 10 < 50 / 2
    assert c.limit == 50


def drive_envoy(c: EnvoyGradient, rtt: float, stop, step: float = 0.01) -> list[int]:
    """Keep the controller's limit full of requests that each take `rtt`, until
    stop(c) holds; returns the limit seen at each step."""
    now, open_, limits = 0.0, [], []
    while not stop(c) and now < 10.0:
        open_.sort(key=lambda x: x[0])
        while open_ and open_[0][0] <= now + 1e-9:
            _, t = open_.pop(0)
            c.release(t, now, Outcome.OK, rtt)
        while (t := c.acquire(now)) is not None:
            open_.append((now + rtt, t))
        limits.append(c.limit)
        now += step
    return limits


def test_envoy_pins_min_concurrency_until_request_count_samples_then_grows_by_gradient():
    c = EnvoyGradient(rng=random.Random(1))
    assert c.in_min_rtt_window and c.limit == 3  # defaults: min_concurrency 3
    limits = drive_envoy(c, 0.05, lambda c: not c.in_min_rtt_window)
    assert set(limits) == {3}  # pinned while 50 samples come in, 3 at a time
    assert len(limits) >= 0.05 / 0.01 * (50 // 3)
    assert c.min_rtt == pytest.approx(0.05)
    assert c.limit == 3  # restored to the limit before the window
    drive_envoy(c, 0.05, lambda c: c.limit != 3)
    # sampleRTT = minRTT: gradient = 1.25 / 1 (buffer 25 %); 3 x 1.25 = 3.75, + sqrt = 5.69
    assert c.limit == 5


def test_envoy_halves_at_most_when_latency_explodes():
    c = EnvoyGradient(rng=random.Random(1))
    c.in_min_rtt_window, c.min_rtt, c._limit, c._next_update = False, 0.1, 400, 1.0
    c.samples[:] = [10.0] * 5  # sampleRTT 100x minRTT: gradient clamped at 0.5
    c.tick(1.0)
    assert c.limit == int(200 + math.sqrt(200))


def test_envoy_bounds_the_limit_by_max_limit():
    c = EnvoyGradient(max_limit=10, rng=random.Random(1))
    c.in_min_rtt_window, c.min_rtt, c._limit, c._next_update = False, 0.1, 9, 1.0
    c.samples[:] = [0.01]
    c.tick(1.0)
    assert c.limit == 10


def test_sre_throttle_never_rejects_while_accepts_keep_up():
    c = SREThrottle(rng=random.Random(0))
    for i in range(100):
        t = c.acquire(i * 0.01)
        assert t is not None
        c.release(t, i * 0.01, Outcome.OK, 0.1)
    assert c.reject_probability(1.0) == 0.0


def test_sre_throttle_rejects_with_the_published_probability_when_the_backend_refuses():
    c = SREThrottle(rng=random.Random(0))
    for i in range(50):  # 50 accepted, then 150 refused: requests 200, accepts 50
        t = c.acquire(0.0)
        c.release(t, 0.0, Outcome.OK, 0.1)
    for i in range(150):
        c.requests += 1  # count attempts without the random local rejection
        c._slot(0.0)[1] += 1
    assert c.reject_probability(0.0) == pytest.approx((200 - 2 * 50) / 201)
    # A 2-minute history: two minutes later it is all forgotten.
    assert c.reject_probability(120.5) == 0.0


def test_make_controller_names_bad_input():
    assert isinstance(make_controller("aimd", {"min_limit": 1}), AIMDLimit)
    with pytest.raises(ValueError, match="unknown controller 'nope'"):
        make_controller("nope")
    with pytest.raises(ValueError, match="no parameter 'bogus'"):
        make_controller("vegas", {"bogus": 1})
