"""The waiting bound is judged on the queue as of the last step boundary plus the arrivals
since (EngineCore.saturation): a hang-up from a full queue, or a raised max_waiting, frees
a place from the next step's start, as vLLM's engine core takes aborts between steps; a
lowered bound refuses at once; an engine with no work left takes both at once. Both
directions: nothing admitted past the bound, nothing refused once a place is free."""

from __future__ import annotations

import pytest

from inference_lab.engine.sim.config import default_deployments
from inference_lab.engine.sim.core import EngineCore, QueueSaturated


def full_queue(max_waiting: int = 2) -> tuple[EngineCore, list]:
    """One request running (a step in flight), `max_waiting` waiting behind it."""
    core = EngineCore(default_deployments("b200", max_waiting)[0])
    core.set_capacity(max_num_seqs=1)
    running = core.submit(16, 1000, 0.0)
    core.step(0.0)  # takes the only running place
    waiting = [core.submit(16, 1000, 0.0001 * (i + 1)) for i in range(max_waiting)]
    assert core.num_running == 1 and core.num_waiting == max_waiting
    return core, [running, *waiting]


def test_a_full_queue_refuses_and_one_place_short_admits():
    core, _ = full_queue(2)
    with pytest.raises(QueueSaturated, match="2 requests waiting"):
        core.submit(16, 10, 0.001)
    core2 = EngineCore(default_deployments("b200", 3)[0])
    core2.set_capacity(max_num_seqs=1)
    core2.submit(16, 1000, 0.0)
    core2.step(0.0)
    for i in range(3):  # one place short until the third
        core2.submit(16, 1000, 0.0001 * (i + 1))
    with pytest.raises(QueueSaturated):
        core2.submit(16, 10, 0.001)


def test_a_hang_up_from_the_queue_frees_its_place_from_the_next_step():
    core, (_, first, _) = full_queue(2)
    core.cancel(first, 0.0005)
    assert core.num_waiting == 1  # gone from the queue ...
    with pytest.raises(QueueSaturated):  # ... but its place counts until the next step
        core.submit(16, 10, 0.0006)
    core.step(core.next_event_time())  # a step boundary
    assert core.submit(16, 10, core.clock - 1e-9) is not None  # now there is room


def test_a_raised_bound_counts_from_the_next_step_and_a_lowered_one_at_once():
    core, _ = full_queue(2)
    core.set_capacity(max_waiting=5)
    assert core.max_waiting == 5  # the live value, as GetCapacity shows it ...
    with pytest.raises(QueueSaturated, match=r"max_waiting = 2\)"):  # ... applies at the step
        core.submit(16, 10, 0.001)
    core.set_capacity(max_waiting=0)  # unbounded, still from the next step
    with pytest.raises(QueueSaturated):
        core.submit(16, 10, 0.001)
    core.step(core.next_event_time())
    assert core.saturation() is None
    for i in range(10):
        core.submit(16, 10, core.clock)
    core.set_capacity(max_waiting=3)  # lowered: refuses at once (12 wait)
    with pytest.raises(QueueSaturated, match=r"max_waiting = 3\)"):
        core.submit(16, 10, core.clock)


def test_an_engine_with_no_work_left_takes_a_hang_up_at_once():
    core = EngineCore(default_deployments("b200", 1)[0])
    core.set_capacity(max_num_seqs=1)
    only = core.submit(16, 10, 0.0)  # waiting: no step has run
    with pytest.raises(QueueSaturated):
        core.submit(16, 10, 0.0)
    core.cancel(only, 0.0)  # nothing left to step: no boundary will come
    assert not core.has_work() and core.saturation() is None
    assert core.submit(16, 10, 0.0) is not None


def test_a_promised_full_queue_admits_nothing_before_the_promise_ends():
    # Every running place taken, the next finish far away: the queue provably stays full
    # for as long as no finish can free a place (EngineCore.full_until); a hang-up from
    # the batch in that time frees its place from the promise's end, not before.
    core, (running, first, second) = full_queue(2)
    step = core.step(core.next_event_time())  # a decode step in flight
    until = core.full_until(step.end, latest=step.end + 0.02)
    assert until == pytest.approx(step.end + 0.02)  # capped: 999 steps to the next finish
    core.promise(until)
    core.cancel(running, step.end)  # the batch's only request hangs up
    assert core.num_running == 0
    with pytest.raises(QueueSaturated):  # its freed place counts from the promise's end
        core.submit(16, 10, until - 1e-6)
    assert core.next_event_time() == until  # nothing runs until then: the next step is there
    core.step(core.next_event_time())  # the first step at or after it takes the queue
    assert core.num_running == 1 and core.num_waiting == 1


def test_a_queue_that_may_move_sooner_is_promised_only_to_the_step_end():
    core, _ = full_queue(2)
    step = core.step(core.next_event_time())
    core.set_capacity(max_num_seqs=2)  # a free running place: the next step may admit
    assert core.full_until(step.end, latest=step.end + 0.02) == step.end


def test_a_place_freed_during_a_promise_is_not_held_by_a_renewed_one():
    core, (running, first, second) = full_queue(2)
    step = core.step(core.next_event_time())
    until = core.full_until(step.end, step.end + 0.02)
    core.promise(until)
    core.cancel(second, step.end)  # a hang-up from the queue: its place waits for `until`
    later = core.step(core.next_event_time())
    # the queue is full now only by that place: the promise is not drawn out
    assert core.full_until(later.end, later.end + 0.02) == until
    while core.next_event_time() < until:
        core.step(core.next_event_time())
    core.step(core.next_event_time())  # the first step at or after it: the place is free
    assert core.saturation() is None and core.submit(16, 10, core.clock) is not None
