"""The stream cadence policy: every step unless late; coalescing engages on sustained
lateness, doubles, relaxes back to every step; a forced cap ignores lateness. The relay's
lateness is judged on wall time (a virtual clock here: a wake-up every STEP)."""

from __future__ import annotations

import math

import pytest

from inference_lab.engine.drivers.cadence import (ADJUST_EVERY, MAX_INTERVAL, MIN_INTERVAL,
                                                   RELAX_AFTER, RELAX_STEP, RELAY_FRESH,
                                                   SHARE_TAU, Cadence)

STEP = 0.0015  # wall s between two wake-ups (a decode step of gpt-oss-20b on B200)
_clock: dict[int, float] = {}  # id(cadence) -> its virtual wall clock


def feed(cadence: Cadence, lag: float, wakeups: int, step: float = STEP) -> list[float]:
    """`wakeups` wake-ups `step` apart; the interval after each change."""
    changes = []
    now = _clock.get(id(cadence), 100.0)
    for _ in range(wakeups):
        now += step
        if cadence.on_lag(lag, now):
            changes.append(cadence.current)
    _clock[id(cadence)] = now
    return changes


def until_changed(cadence: Cadence, limit: int = 10_000) -> int:
    """Wake-ups (STEP apart, on time) until the interval changes."""
    for n in range(1, limit + 1):
        if feed(cadence, 0.0001, 1):
            return n
    raise AssertionError("no change")


def seconds(wall: float, step: float = STEP) -> int:
    """Wake-ups in `wall` seconds."""
    return round(wall / step)


def test_on_time_wakeups_deliver_every_step():
    cadence = Cadence()
    assert feed(cadence, 0.0003, 1000) == []
    assert cadence.interval(256) == 0.0 and cadence.engaged == 0


def test_a_single_late_wakeup_does_not_engage_it():
    cadence = Cadence()
    feed(cadence, 0.0, 100)
    feed(cadence, 0.040, 1)  # one 40 ms hiccup: the mean moves by 40 x (1 - e^(-1.5/50)) ~ 1.2 ms
    assert feed(cadence, 0.0, 100) == [] and cadence.current == 0.0
    feed(cadence, 600.0, 1)  # a 10-minute stall counts as one LAG_CLAMP-late wake-up
    assert feed(cadence, 0.0, 100) == [] and cadence.current == 0.0


def test_sustained_lateness_engages_then_doubles_up_to_the_maximum():
    cadence = Cadence()
    changes = feed(cadence, 0.010, 20 * ADJUST_EVERY)
    assert changes[0] == MIN_INTERVAL
    assert changes[1] == 2 * MIN_INTERVAL
    assert changes[-1] == MAX_INTERVAL and len(changes) == 7  # 1, 2, 4, ..., 32, then 50 ms
    assert cadence.engaged == 1
    assert cadence.interval(4) == MAX_INTERVAL  # whatever the stream count


def test_on_time_again_it_halves_back_to_every_step():
    cadence = Cadence()
    feed(cadence, 0.010, 3 * ADJUST_EVERY)  # 1 ms, then 2 ms, then 4 ms
    assert cadence.current == 4 * MIN_INTERVAL
    changes = feed(cadence, 0.0, seconds(1.0))
    # the mean lag falls under 0.5 ms after 50 ms x ln(20) ~ 0.15 s (one more doubling in
    # that time), then it halves after RELAX_AFTER and every RELAX_STEP down to every step
    assert changes == [8 * MIN_INTERVAL, 4 * MIN_INTERVAL, 2 * MIN_INTERVAL, MIN_INTERVAL, 0.0]
    feed(cadence, 0.010, 3 * ADJUST_EVERY)
    assert cadence.engaged == 2


def back_to_every_step(cadence: Cadence, step: float = STEP) -> float:
    """Wall seconds of on-time wake-ups (relay on time) until it delivers every step."""
    cadence.on_relay(0.0002)
    for n in range(1, seconds(30.0, step)):
        feed(cadence, 0.0001, 1, step)
        if cadence.current == 0.0:
            return n * step
    raise AssertionError(f"still at {cadence.current * 1e3:g} ms after 30 s on time")


@pytest.mark.parametrize("step", [STEP, 0.010, MAX_INTERVAL])
def test_at_the_cap_it_returns_to_every_step_within_a_second_of_the_lateness_ending(step):
    # 128 streams: the gateway late all the time until the interval is at its cap; then 24
    # streams, on time. (Whatever the wake-up rate: at the cap the pacer wakes ~every 50 ms.)
    cadence = Cadence()
    cadence.on_relay(0.005)
    feed(cadence, 0.0001, seconds(0.4, step) + 8 * ADJUST_EVERY, step)
    assert cadence.current == MAX_INTERVAL
    assert back_to_every_step(cadence, step) <= RELAX_AFTER + 5 * RELAX_STEP + 2 * step < 1.0


def test_late_under_an_eighth_of_the_time_then_on_time_it_still_relaxes():
    cadence = Cadence()
    cadence.on_relay(0.005)
    until_changed(cadence)
    feed(cadence, 0.0001, 2 * ADJUST_EVERY)
    assert cadence.current == 4 * MIN_INTERVAL
    for _ in range(20):  # late 1 wake-up in 20 (5 %): neither doubles nor relaxes ...
        cadence.on_relay(0.005)
        feed(cadence, 0.0001, 1)
        cadence.on_relay(0.0002)
        feed(cadence, 0.0001, 19)
    assert cadence.current == 4 * MIN_INTERVAL
    assert back_to_every_step(cadence) < 1.0  # ... and on time again, it relaxes


def test_after_a_stall_it_returns_to_every_step_within_a_second():
    cadence = Cadence()
    feed(cadence, 0.0001, 100)
    feed(cadence, 6.0, 1)  # the engine stopped for 6 s
    feed(cadence, 0.008, 200)  # then catches up for a while, late
    assert cadence.current > 0
    assert back_to_every_step(cadence) < 1.0


def test_never_coalescing_ignores_lateness():
    cadence = Cadence(when_late=False)
    assert feed(cadence, 0.5, 1000) == [] and cadence.interval(256) == 0.0


def test_a_forced_rate_is_streams_over_rate_at_least_a_millisecond_whatever_the_lag():
    cadence = Cadence(rate=10_000.0)
    assert feed(cadence, 0.5, 1000) == []
    assert cadence.interval(256) == pytest.approx(0.0256)
    assert cadence.interval(4) == MIN_INTERVAL


def test_a_negative_rate_is_refused():
    with pytest.raises(ValueError, match="rate must be >= 0"):
        Cadence(rate=-1.0)


def test_a_relay_late_for_a_lasting_share_of_wall_time_engages_it_then_it_steers_by_its_level():
    cadence = Cadence()
    cadence.on_relay(0.005)  # the gateway reads the batches 5 ms late, and stays so
    # the late share reaches 1/4 after SHARE_TAU x ln(4/3) ~ 0.29 s: on at the next
    # ADJUST_EVERY wake-up (every 48 ms here), not before
    assert feed(cadence, 0.0001, seconds(0.25)) == [] and cadence.engaged == 0
    assert until_changed(cadence) * STEP == pytest.approx(0.29 - 0.25, abs=0.05)
    assert cadence.current == MIN_INTERVAL
    assert cadence.engaged == 1 and cadence.lateness == 0.005
    # on: late all the time since the last change, so it doubles every ADJUST_EVERY
    assert feed(cadence, 0.0001, 2 * ADJUST_EVERY) == [2 * MIN_INTERVAL, 4 * MIN_INTERVAL]
    cadence.on_relay(0.0002)  # caught up: halves back after RELAX_AFTER, then each RELAX_STEP
    assert feed(cadence, 0.0001, seconds(RELAX_AFTER) - 1) == []
    assert feed(cadence, 0.0001, seconds(2 * RELAX_STEP) + 2) == [2 * MIN_INTERVAL, MIN_INTERVAL, 0.0]
    assert cadence.late_share < 0.25  # (the share decays with the time on time: not on again)


def test_a_relay_late_in_short_stretches_engages_it_by_their_sum():
    # A saturated gateway: late for 6 ms, on time for 9 ms, over and over (40 % of the
    # time), never late for 64 wake-ups in a row. It switches on within ~1 s.
    cadence = Cadence()
    changes = []
    for _ in range(seconds(2.0) // 10):
        cadence.on_relay(0.001)
        changes += feed(cadence, 0.0001, 4)
        cadence.on_relay(0.0003)
        changes += feed(cadence, 0.0001, 6)
    assert changes[0] == MIN_INTERVAL and cadence.engaged == 1
    assert 0.3 < cadence.late_share < 0.5  # (its duty cycle, 0.4, seen over ~SHARE_TAU)
    assert changes[-1] >= 4 * MIN_INTERVAL  # late 40 % of the time: it kept doubling


def test_a_start_up_burst_of_relay_lateness_shorter_than_the_window_does_not_engage_it():
    cadence = Cadence()
    cadence.on_relay(0.020)  # 20 ms late for 0.2 s (clients connecting at once) ...
    feed(cadence, 0.0001, seconds(0.2))
    assert cadence.late_share > 0.15  # (seen, but not a lasting share)
    cadence.on_relay(0.0004)  # ... then on time
    assert feed(cadence, 0.0001, seconds(2.0)) == [] and cadence.engaged == 0
    # the same burst at a slower step rate (fewer wake-ups, same wall time): the same
    slow = Cadence()
    slow.on_relay(0.020)
    feed(slow, 0.0001, seconds(0.2, 0.010), step=0.010)
    slow.on_relay(0.0004)
    assert feed(slow, 0.0001, seconds(2.0, 0.010), step=0.010) == [] and slow.engaged == 0


def test_once_on_a_late_moment_does_not_double_it_nor_does_it_relax_while_late_now_and_then():
    cadence = Cadence()
    cadence.on_relay(0.005)
    until_changed(cadence)
    feed(cadence, 0.0001, 2 * ADJUST_EVERY)
    assert cadence.current == 4 * MIN_INTERVAL
    changes = []
    for _ in range(30):  # late 1 wake-up in 100 (1 %, every 0.15 s): neither way
        cadence.on_relay(0.005)
        changes += feed(cadence, 0.0001, 1)
        cadence.on_relay(0.0002)
        changes += feed(cadence, 0.0001, 99)
    assert changes == [] and cadence.current == 4 * MIN_INTERVAL


def test_a_stale_level_counts_for_at_most_relay_fresh_of_a_long_sleep():
    cadence = Cadence()
    cadence.on_relay(0.005)  # the last report before the load stopped said late
    feed(cadence, 0.0001, 11, step=SHARE_TAU)  # then 10 gaps of a second: 0.2 s of evidence
    assert cadence.late_share == pytest.approx(-math.expm1(-10 * RELAY_FRESH / SHARE_TAU))
    assert cadence.engaged == 0


def test_a_relay_level_under_the_threshold_or_not_a_number_changes_nothing():
    cadence = Cadence()
    cadence.on_relay(0.0004)  # reported, but under RELAY_LATE (0.5 ms)
    assert feed(cadence, 0.0001, seconds(2.0)) == [] and cadence.late_share == 0.0
    cadence.on_relay(float("nan"))
    assert cadence.relay == 0.0


def test_never_coalescing_ignores_a_late_relay_too():
    cadence = Cadence(when_late=False)
    cadence.on_relay(0.050)
    assert feed(cadence, 0.0, 1000) == [] and cadence.interval(256) == 0.0
