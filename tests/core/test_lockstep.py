"""An MoE data-parallel rank's view of its group's steps (engine.drivers.lockstep): a step
ends with the slowest rank's booked at the same instant, a step may not start inside one
a peer began earlier, and each group step is heard of once however many peers announce it."""

from inference_lab.engine.drivers.lockstep import Lockstep


def test_a_step_ends_with_the_slowest_rank_s_step_of_the_same_instant():
    sent = []
    rank = Lockstep(lambda s, e: sent.append((s, e)))
    rank.peer(10.0, 10.004)  # a peer's step at the same instant, 4 ms
    rank.peer(10.0, 10.002)
    rank.peer(9.0, 9.5)  # an earlier step: not this one
    rank.announce(10.0, 10.001)
    assert sent == [(10.0, 10.001)]
    assert rank.aligned_end(10.0, 10.001) == 10.004
    assert rank.aligned_end(10.0, 10.006) == 10.006  # this rank the slowest
    assert rank.aligned_end(11.0, 11.001) == 11.001  # no peer at that instant


def test_a_step_may_not_start_inside_a_group_step_that_began_before_it():
    rank = Lockstep(lambda s, e: None)
    rank.peer(10.0, 10.004)
    assert rank.covering(10.001) == 10.004  # joined as a dummy pass: wait for its end
    assert rank.covering(10.0) is None  # booked with it: one group step
    assert rank.covering(10.004) is None  # at its end: the next group step
    assert rank.covering(9.999) is None


def test_each_group_step_is_new_once():
    rank = Lockstep(lambda s, e: None)
    assert rank.peer(10.0, 10.004) is True
    assert rank.peer(10.0, 10.003) is False  # a third rank announcing the same step
    assert rank.peer(10.004, 10.008) is True


def test_only_the_latest_steps_are_kept():
    rank = Lockstep(lambda s, e: None)
    for i in range(200):
        rank.peer(float(i), i + 0.001)
    assert rank.covering(5.0005) is None  # long gone (the cost of a look stays bounded)
    assert rank.covering(199.0005) == 199.001
    assert rank.aligned_end(199.0, 199.0005) == 199.001
