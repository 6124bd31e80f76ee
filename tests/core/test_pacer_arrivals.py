"""Where and when the pacer books an arrival its sender stamped (Pacer.arrive): at the
stamp, in the order of the stamps, with every step in between, and no step decided while
a sender still holds arrivals stamped before its start (the hold), so that a burst is
judged as the offline driver judges it whatever the order and the delay in which its
requests reach the engine. Driven on virtual clocks (the loop's and the monotonic one the
stamps are read on), so every expected instant is exact."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_lab.engine.drivers.offline import admissions
from inference_lab.engine.drivers.pacer import Pacer
from inference_lab.engine.sim.config import default_deployments
from inference_lab.engine.sim.core import EngineCore, QueueSaturated


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


class Hold:
    """A sender's hold as the pacer reads it (`at` None: it holds nothing)."""

    def __init__(self) -> None:
        self.at: float | None = None

    @property
    def oldest(self) -> float | None:
        return self.at


async def pacer_at(wall: float, time_scale: float = 1.0, max_waiting: int = 0,
                   hold: Hold | None = None, late: list | None = None) -> tuple[Pacer, Clock]:
    """A pacer whose wall clock (time.monotonic, which stamps are read on too: one
    machine's CLOCK_MONOTONIC) reads `wall`, with sim time 0 at wall 100."""
    core = EngineCore(default_deployments("b200", max_waiting or None)[0])
    pacer = Pacer(core, time_scale=time_scale, hold=hold,
                  on_late=late.append if late is not None else None)
    clock = Clock(wall)
    pacer.epoch, pacer.monotonic = 100.0, clock.time
    return pacer, clock


def book(pacer: Pacer, stamp: float | None, prompt: int = 16, max_tokens: int = 20):
    return pacer.submit(prompt, max_tokens, Sink(), 1, arrived=stamp)


async def test_an_idle_engine_books_the_arrival_at_the_stamp_and_starts_its_step_there():
    pacer, clock = await pacer_at(101.0)
    req = book(pacer, 101.0 - 0.0003)  # read by the gateway 0.3 ms ago
    assert req.arrival == pytest.approx(1.0 - 0.0003)
    pacer._advance(pacer.sim_now())
    assert pacer.inflight.start == req.arrival  # its prefill began when it arrived
    pacer._alarm.close()


async def test_an_arrival_is_booked_at_its_stamp_even_when_its_first_token_is_due_already():
    # 10 ms ago: more than its first step takes. The modelled engine took it then; its
    # first token is late on the wall clock (delivered at once), never moved in the model.
    pacer, clock = await pacer_at(101.0)
    req = book(pacer, 101.0 - 0.010)
    assert req.arrival == pytest.approx(0.990)
    pacer._advance(pacer.sim_now())
    assert req.first_token < pacer.sim_now()
    assert pacer.due_mark == pacer.core.progress_marks()[1]  # its step has ended: due now
    pacer._alarm.close()


async def test_a_busy_engine_books_an_arrival_stamped_before_the_step_it_decided_late_and_counts_it():
    late: list[float] = []
    pacer, clock = await pacer_at(101.0, late=late)
    first = book(pacer, None, prompt=4000)  # a long prefill step, booked now
    pacer._advance(pacer.sim_now())
    step = pacer.inflight
    assert step.start == first.arrival == 1.0 and step.end > 1.005
    clock.t += 0.004  # 4 ms into that step, a request stamped 6 ms ago reaches the engine
    behind = book(pacer, clock.t - 0.006)
    assert behind.arrival == step.start and late == [pytest.approx(0.002)]
    clock.t += 0.0005
    recent = book(pacer, clock.t - 0.001)  # stamped inside the step: taken as it is
    assert recent.arrival == pytest.approx(1.0035) and len(late) == 1
    pacer._alarm.close()


async def test_a_stamp_from_the_future_is_now_and_one_far_in_the_past_is_max_trail_old():
    pacer, clock = await pacer_at(110.0, time_scale=0.25)  # sim 2.5 now
    assert book(pacer, clock.t + 5.0).arrival == pytest.approx(2.5)  # another clock
    pacer2, clock2 = await pacer_at(110.0, time_scale=0.25)
    old = book(pacer2, clock2.t - 3600.0)  # an hour: taken as MAX_TRAIL (1 s of wall)
    assert old.arrival == pytest.approx(2.5 - Pacer.MAX_TRAIL * 0.25)
    pacer3, clock3 = await pacer_at(110.0)
    assert book(pacer3, float("nan")).arrival == pytest.approx(10.0)
    for p in (pacer, pacer2, pacer3):
        p._alarm.close()


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


async def test_while_a_sender_holds_no_arrival_or_step_after_its_hold_is_decided():
    hold = Hold()
    pacer, clock = await pacer_at(101.0, max_waiting=64, hold=hold)
    hold.at = 100.5  # the sender has read a request stamped at sim 0.5, not sent yet
    assert book(pacer, 100.7, max_tokens=4000) is None  # stamped after the hold: waits
    pacer._advance(pacer.sim_now())
    assert pacer.inflight is None and pacer.core.num_waiting == 0  # nothing decided
    assert pacer.open_streams() == 1
    early = book(pacer, 100.5, max_tokens=4000)  # the held one: within the hold, judged now
    assert early.arrival == 0.5
    pacer._advance(pacer.sim_now())  # its step ran from 0.5; the one at 0.7 still waits,
    assert pacer.core.num_running == 1 and pacer.core.num_waiting == 0  # and so does the
    assert 0.5 < pacer.core.clock < 0.51 and pacer.open_streams() == 2  # step after (held)
    hold.at = None  # the sender has sent everything
    pacer._advance(pacer.sim_now())
    assert pacer.core.num_running == 2  # judged at 0.7, in the step that followed
    pacer._alarm.close()


async def test_a_hold_older_than_max_trail_lets_the_clock_go_on_max_trail_behind():
    hold, late = Hold(), []
    pacer, clock = await pacer_at(103.0, max_waiting=64, hold=hold, late=late)
    hold.at = 101.0  # held for 2 s: the clock may trail by MAX_TRAIL only
    assert pacer.horizon(pacer.sim_now()) == pytest.approx(3.0 - Pacer.MAX_TRAIL)
    assert book(pacer, 102.2, max_tokens=4000) is None  # after the horizon: waits
    behind = book(pacer, 101.5)  # older than MAX_TRAIL: booked that far back, counted
    assert behind.arrival == pytest.approx(2.0) and late == [pytest.approx(0.5)]
    pacer._alarm.close()


async def test_a_queue_without_a_bound_is_not_held():
    # nothing is refused there, so no admission depends on the order of its arrivals
    hold = Hold()
    pacer, clock = await pacer_at(101.0, hold=hold)
    hold.at = 100.5
    assert pacer.horizon(pacer.sim_now()) == pacer.sim_now()
    assert book(pacer, 100.7) is not None
    pacer.core.set_capacity(max_waiting=64)
    assert pacer.horizon(pacer.sim_now()) == 0.5
    pacer._alarm.close()


async def test_a_burst_handed_over_out_of_order_is_judged_in_the_order_of_its_stamps():
    hold = Hold()
    pacer, clock = await pacer_at(100.2, max_waiting=2, hold=hold)
    stamps = [100.0 + i * 1e-5 for i in range(6)]  # all stamped before any step ends
    hold.at = stamps[0]
    decided = {}
    for i in (5, 3, 4, 1, 2, 0):  # the gateway sends them in another order
        pacer.arrive(16, 200, Sink(), i, arrived=stamps[i], decide=False,
                     decided=lambda a, req, exc, i=i: decided.__setitem__(i, req is not None))
    hold.at = None
    pacer.decide()
    # 0 starts a step alone; 1 and 2 wait; 3, 4 and 5 find the queue full.
    assert decided == {0: True, 1: True, 2: True, 3: False, 4: False, 5: False}
    pacer._alarm.close()


async def drive_burst(stamps: list[float], chunks: list[int], lag: float, max_waiting: int):
    """Hand `stamps` (sim s from 0) to a pacer in chunks of shuffled order, each chunk
    `lag` wall s after the last of its stamps (a gateway behind by that much), holding the
    oldest stamp not yet handed over, and running the pacer's loop as time passes.
    Returns which were admitted, in stamp order."""
    hold = Hold()
    pacer, clock = await pacer_at(100.0, max_waiting=max_waiting, hold=hold)
    admitted: dict[int, bool] = {}
    pending = sorted(range(len(stamps)), key=lambda i: stamps[i])
    hold.at = 100.0 + stamps[pending[0]]
    at = 0
    for size in chunks:
        chunk = pending[at:at + size]
        if not chunk:
            break
        at += size
        clock.t = max(clock.t, 100.0 + max(stamps[i] for i in chunk) + lag)
        pacer._advance(pacer.sim_now())  # the loop ran meanwhile, held
        pacer._deliver()
        random.Random(at).shuffle(chunk)
        for i in chunk:
            pacer.arrive(16, 4000, Sink(), i, arrived=100.0 + stamps[i], decide=False,
                         decided=lambda a, req, exc, i=i: admitted.__setitem__(i, req is not None))
        hold.at = 100.0 + stamps[pending[at]] if at < len(pending) else None
        pacer.decide()
    hold.at = None
    pacer.decide()
    pacer._alarm.close()
    return [admitted[i] for i in range(len(stamps))]


@settings(max_examples=25, deadline=None)
@given(n=st.integers(50, 400), spread=st.floats(0.001, 0.05), lag=st.floats(0.0, 0.3),
       chunk=st.integers(1, 120), seed=st.integers(0, 1000))
async def test_a_held_burst_admits_exactly_what_the_modelled_engine_admits(n, spread, lag, chunk,
                                                                           seed):
    rng = random.Random(seed)
    stamps = sorted(rng.uniform(0.0, spread) for _ in range(n))
    chunks = [rng.randint(1, chunk) for _ in range(n)]
    got = await drive_burst(stamps, chunks, lag, max_waiting=16)
    model = admissions(EngineCore(default_deployments("b200", 16)[0]),
                       [(t, 16, 4000) for t in stamps])
    assert got == model  # nothing over-admitted, nothing wrongly refused
    assert sum(got) >= 16  # (the bound was reached: the test can fail both ways)


async def test_without_the_hold_a_late_burst_is_misjudged_which_the_hold_prevents():
    # The same burst handed over 200 ms late in chunks: held, exact; not held, the engine
    # decides steps without the requests it has not seen and admits others.
    stamps = [i * 2e-5 for i in range(300)]
    model = admissions(EngineCore(default_deployments("b200", 16)[0]),
                       [(t, 16, 4000) for t in stamps])
    assert await drive_burst(stamps, [40] * 8, 0.2, max_waiting=16) == model

    pacer, clock = await pacer_at(100.0, max_waiting=16)  # no hold
    admitted = {}
    for start in range(0, 300, 40):
        clock.t = 100.0 + stamps[min(start + 39, 299)] + 0.2
        pacer._advance(pacer.sim_now())
        for i in range(start, min(start + 40, 300)):
            pacer.arrive(16, 4000, Sink(), i, arrived=100.0 + stamps[i],
                         decided=lambda a, req, exc, i=i: admitted.__setitem__(i, req is not None))
    assert [admitted[i] for i in range(300)] != model
    pacer._alarm.close()
