"""The stream cadence policy: every step unless late; coalescing engages on sustained
lateness, doubles, relaxes back to every step; a forced cap ignores lateness."""

from __future__ import annotations

import pytest

from inference_lab.engine.drivers.cadence import (ADJUST_EVERY, MAX_INTERVAL, MIN_INTERVAL,
                                                   RELAX_EVERY, RELAY_PERSIST, Cadence)


def feed(cadence: Cadence, lag: float, wakeups: int) -> list[float]:
    """The interval after each change."""
    return [cadence.current for _ in range(wakeups) if cadence.on_lag(lag)]


def test_on_time_wakeups_deliver_every_step():
    cadence = Cadence()
    assert feed(cadence, 0.0003, 1000) == []
    assert cadence.interval(256) == 0.0 and cadence.engaged == 0


def test_a_single_late_wakeup_does_not_engage_it():
    cadence = Cadence()
    feed(cadence, 0.0, 100)
    cadence.on_lag(0.040)  # one 40 ms hiccup: the mean moves by 40/32 = 1.25 ms < 2 ms
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
    changes = feed(cadence, 0.0, 5 * RELAX_EVERY)
    # the mean lag takes ~96 wake-ups to fall under 0.5 ms (10 ms x (31/32)^96): one more
    # doubling first (at 32 wake-ups), then a halving every RELAX_EVERY down to every step
    assert changes == [8 * MIN_INTERVAL, 4 * MIN_INTERVAL, 2 * MIN_INTERVAL, MIN_INTERVAL, 0.0]
    feed(cadence, 0.010, 3 * ADJUST_EVERY)
    assert cadence.engaged == 2


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


def test_a_relay_that_stays_late_engages_it_while_the_pacer_is_on_time_until_told_otherwise():
    cadence = Cadence()
    cadence.on_relay(0.005)  # the gateway reads the batches 5 ms late, and stays so
    # late once RELAY_PERSIST (64) wake-ups in a row found it so, then every ADJUST_EVERY
    assert feed(cadence, 0.0001, 3 * ADJUST_EVERY) == [MIN_INTERVAL, 2 * MIN_INTERVAL]
    assert cadence.engaged == 1 and cadence.lateness == 0.005
    cadence.on_relay(0.0002)  # caught up: halves back like on-time wake-ups
    assert feed(cadence, 0.0001, 3 * RELAX_EVERY) == [MIN_INTERVAL, 0.0]


def test_a_burst_of_relay_lateness_does_not_engage_it():
    cadence = Cadence()
    cadence.on_relay(0.020)  # 20 ms late for 60 wake-ups (~90 ms of 1.5 ms steps) ...
    feed(cadence, 0.0001, RELAY_PERSIST - 4)
    cadence.on_relay(0.0004)  # ... then on time
    assert feed(cadence, 0.0001, 4 * ADJUST_EVERY) == [] and cadence.engaged == 0


def test_a_relay_level_under_the_threshold_or_not_a_number_changes_nothing():
    cadence = Cadence()
    cadence.on_relay(0.0019)  # late, but under LATE (2 ms)
    assert feed(cadence, 0.0001, 4 * ADJUST_EVERY) == []
    cadence.on_relay(float("nan"))
    assert cadence.relay == 0.0


def test_never_coalescing_ignores_a_late_relay_too():
    cadence = Cadence(when_late=False)
    cadence.on_relay(0.050)
    assert feed(cadence, 0.0, 1000) == [] and cadence.interval(256) == 0.0
