"""Where the pacer books an arrival its sender stamped (Pacer.arrival_of): at the stamp,
as far back as the clock can honour. Driven on virtual clocks (the loop's and the
monotonic one the stamps are read on), so every expected instant is exact."""

from __future__ import annotations

import pytest

from inference_lab.engine.drivers.pacer import Pacer
from inference_lab.engine.sim.config import default_deployments
from inference_lab.engine.sim.core import EngineCore


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def time(self) -> float:
        return self.t


class Sink:
    def on_tokens(self, stream, total: int) -> None:
        pass

    def on_finished(self, stream, req) -> None:
        pass

    def flush(self) -> None:
        pass


async def pacer_at(wall: float, time_scale: float = 1.0) -> tuple[Pacer, Clock]:
    """A pacer whose wall clock (time.monotonic, which stamps are read on too: one
    machine's CLOCK_MONOTONIC) reads `wall`, with sim time 0 at wall 100."""
    pacer = Pacer(EngineCore(default_deployments("b200")[0]), time_scale=time_scale)
    clock = Clock(wall)
    pacer.epoch, pacer.monotonic = 100.0, clock.time
    return pacer, clock


def book(pacer: Pacer, stamp: float | None, prompt: int = 16):
    return pacer.submit(prompt, 20, Sink(), 1, arrived=stamp)


async def test_an_idle_engine_books_the_arrival_at_the_stamp_and_starts_its_step_there():
    pacer, clock = await pacer_at(101.0)
    fastest = pacer.core.fastest_first_token()  # 0.447 ms for gpt-oss-20b on b200
    assert 0.0004 < fastest < 0.0005
    req = book(pacer, 101.0 - 0.0003)  # read by the gateway 0.3 ms ago
    assert req.arrival == pytest.approx(1.0 - 0.0003)
    pacer._advance(pacer.sim_now())
    assert pacer.inflight.start == req.arrival  # its prefill began when it arrived
    pacer._alarm.close()


async def test_an_idle_engine_never_books_so_far_back_that_the_first_token_is_due_already():
    pacer, clock = await pacer_at(101.0)
    req = book(pacer, 101.0 - 0.010)  # 10 ms ago: more than any first token takes
    assert req.arrival == pytest.approx(1.0 - pacer.core.fastest_first_token())
    pacer._advance(pacer.sim_now())
    assert pacer.inflight.end >= pacer.sim_now()  # due now at the earliest: not late
    pacer._alarm.close()


async def test_requests_that_reach_an_idle_engine_together_are_booked_together_in_one_step():
    # A completions batch: every prompt stamped at once, submitted a few microseconds
    # apart in one Session message; the floor is the first one's, so one step takes all.
    pacer, clock = await pacer_at(101.0)
    stamp = 101.0 - 0.010
    first = book(pacer, stamp)
    clock.t += 0.00001
    second = book(pacer, stamp)
    assert second.arrival == first.arrival == pytest.approx(1.0 - pacer.core.fastest_first_token())
    pacer._advance(pacer.sim_now())
    assert pacer.core.num_running == 2 and pacer.inflight.prefill_tokens == 32
    clock.t += 0.01  # after the pacer looked, a new arrival has a floor of its own
    pacer._advance(pacer.sim_now())
    third = book(pacer, clock.t - 0.010)
    assert third.arrival > first.arrival
    pacer._alarm.close()


async def test_a_busy_engine_books_no_arrival_before_the_step_it_decided_without_it():
    pacer, clock = await pacer_at(101.0)
    first = book(pacer, None, prompt=4000)  # a long prefill step, booked now
    pacer._advance(pacer.sim_now())
    step = pacer.inflight
    assert step.start == first.arrival == 1.0 and step.end > 1.005
    clock.t += 0.004  # 4 ms into that step, a request stamped 6 ms ago reaches the engine
    late = book(pacer, clock.t - 0.006)
    assert late.arrival == step.start
    clock.t += 0.0005
    recent = book(pacer, clock.t - 0.001)  # stamped inside the step: taken as it is
    assert recent.arrival == pytest.approx(1.0035)
    pacer._alarm.close()


async def test_a_stamp_from_the_future_is_now_and_one_far_in_the_past_is_max_backdate_old():
    pacer, clock = await pacer_at(101.0, time_scale=0.25)  # sim 0.25 now
    book(pacer, None, prompt=8000)  # a 15.8 ms (modelled) prefill: 63 ms of wall
    pacer._advance(pacer.sim_now())
    assert pacer.inflight.start == 0.25 and pacer.inflight.end > 0.265
    clock.t += 0.030  # 30 ms of wall into it: sim 0.2575
    assert book(pacer, clock.t + 5.0).arrival == pytest.approx(0.2575)  # another clock
    old = book(pacer, clock.t - 3600.0)  # an hour: taken as MAX_BACKDATE (20 ms of wall)
    assert old.arrival == pytest.approx(0.2575 - Pacer.MAX_BACKDATE * 0.25)
    assert book(pacer, float("nan")).arrival == pytest.approx(0.2575)
    pacer._alarm.close()


async def test_under_time_scale_the_stamps_age_counts_in_modelled_seconds():
    pacer, clock = await pacer_at(101.0, time_scale=0.5)  # modelled clock at half speed
    assert pacer.sim_now() == pytest.approx(0.5)
    req = book(pacer, 101.0 - 0.0006)  # 0.6 ms of wall = 0.3 ms modelled
    assert req.arrival == pytest.approx(0.5 - 0.0003)
    pacer._alarm.close()


async def test_a_stalled_clock_books_at_the_instant_it_stopped_and_none_inside_the_stall():
    pacer, clock = await pacer_at(101.0)
    pacer.freeze()
    clock.t += 2.0
    assert book(pacer, clock.t - 0.0001).arrival == 1.0  # frozen at sim 1.0
    pacer.thaw()  # the sim clock runs on from 1.0
    clock.t += 0.0001
    assert book(pacer, clock.t - 0.0004).arrival == pytest.approx(1.0)  # not back into it
    pacer._alarm.close()
