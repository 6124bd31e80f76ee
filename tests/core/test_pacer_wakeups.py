"""The pacer's wake-up plan, driven on a virtual clock: it skips wake-ups that would
deliver nothing, yet every first token and every completion is handed over exactly at
the end of the step that produced it, and the simulation is the same as waking at every
step (deterministic: no wall clock involved)."""

from __future__ import annotations

import pytest

from inference_lab.engine.sim.config import default_deployments
from inference_lab.engine.sim.core import EngineCore
from inference_lab.engine.drivers.pacer import Pacer


class VirtualClock:
    def __init__(self) -> None:
        self.t = 0.0

    def time(self) -> float:
        return self.t


class Sink:
    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.first: dict[int, float] = {}  # tag -> when its first token was handed over
        self.done: dict[int, tuple[float, int]] = {}  # tag -> (when, tokens)
        self.updates = 0

    def on_tokens(self, stream, total: int) -> None:
        self.first.setdefault(stream.tag, self.clock.t)
        self.updates += 1

    def on_finished(self, stream, req) -> None:
        self.done[stream.tag] = (self.clock.t, req.num_output)

    def flush(self) -> None:
        pass


def drive(update_rate: float, arrivals: list[tuple[float, int]], time_scale: float = 1.0):
    """Run the pacer as its loop would, jumping the clock to each planned wake-up (or to
    an arrival, which ends a sleep). Arrivals are in modelled seconds, the sink's times in
    the (virtual) wall clock's. Returns requests, sink, wake-ups, steps."""
    core = EngineCore(default_deployments("b200")[0])
    steps = []
    pacer = Pacer(core, update_rate=update_rate, on_step=steps.append, time_scale=time_scale)
    clock = VirtualClock()
    pacer.monotonic, pacer.epoch = clock.time, 0.0
    sink = Sink(clock)
    pending = sorted(arrivals)
    requests, wakeups = {}, 0
    while pending or pacer.inflight is not None or core.has_work():
        if pacer.inflight is None and not core.has_work():
            clock.t = pacer.wall_of(pending[0][0])  # idle until the next arrival
        while pending and pending[0][0] <= pacer.sim_now():
            _, max_tokens = pending.pop(0)
            tag = len(requests)
            requests[tag] = pacer.submit(16, max_tokens, sink, tag)
        wakeups += 1
        pacer._advance(pacer.sim_now())
        pacer._deliver()
        if pacer.inflight is not None:
            target = pacer._next_wake()
            clock.t = pacer.wall_of(min(target, pending[0][0]) if pending else target)
    pacer._alarm.close()
    return requests, sink, wakeups, steps


ARRIVALS = [(0.0, 200), (0.0, 37), (0.004, 120), (0.0301, 64), (0.05, 9), (0.2, 150)]


@pytest.mark.parametrize("update_rate", [100.0, 10_000.0])
async def test_skipped_wakeups_never_delay_a_first_token_or_a_completion(update_rate):
    requests, sink, wakeups, steps = drive(update_rate, ARRIVALS)
    assert wakeups < 0.75 * len(steps)  # most decode steps needed no wake-up of their own
    for tag, req in requests.items():
        assert sink.first[tag] == req.first_token  # handed over at the step's end exactly
        assert sink.done[tag] == (req.finish_time, req.max_tokens)


async def test_the_simulation_does_not_depend_on_how_often_the_pacer_wakes():
    lazy, _, lazy_wakeups, lazy_steps = drive(10_000.0, ARRIVALS)
    every, _, every_wakeups, every_steps = drive(0.0, ARRIVALS)  # no cap: every step end
    assert every_wakeups >= len(every_steps) > lazy_wakeups
    assert [(s.start, s.end, s.num_tokens) for s in lazy_steps] == \
        [(s.start, s.end, s.num_tokens) for s in every_steps]
    assert [(r.first_token, r.finish_time) for r in lazy.values()] == \
        [(r.first_token, r.finish_time) for r in every.values()]


async def test_a_time_scale_runs_the_same_simulation_k_times_faster_on_the_wall():
    # K = 4 (a power of two, so sim <-> wall conversions are exact in floating point).
    fast, fast_sink, _, fast_steps = drive(10_000.0, ARRIVALS, time_scale=4.0)
    real, real_sink, _, real_steps = drive(10_000.0, ARRIVALS)
    assert [(s.start, s.end) for s in fast_steps] == [(s.start, s.end) for s in real_steps]
    for tag, req in fast.items():
        assert req.finish_time == real[tag].finish_time  # reported times stay modelled
        assert fast_sink.first[tag] == req.first_token / 4  # handed over 4x sooner on the wall
        assert fast_sink.done[tag][0] == req.finish_time / 4


def test_a_time_scale_must_be_positive():
    with pytest.raises(ValueError, match="time_scale"):
        Pacer(EngineCore(default_deployments("b200")[0]), time_scale=0.0)
