"""vLLM's internal data-parallel load balancing: the score, the start index, the local
additions between publications, and when the coordinator publishes."""

import pytest

from inference_lab.common.dp_balance import Coordinator, RankBalancer


def test_an_idle_fleet_is_dealt_round_robin_from_the_start_index():
    # every rank idle: each pick adds 1 waiting (score 4) to the chosen rank, so the
    # next lowest is the next rank in order from the start
    balancer = RankBalancer(4)
    assert [balancer.pick() for _ in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]


def test_front_ends_start_at_their_share_of_the_ranks():
    # 4 ranks, 2 front ends: starts at (4 x 0) // 2 = 0 and (4 x 1) // 2 = 2
    assert RankBalancer(4, 0, 2).pick() == 0
    assert RankBalancer(4, 1, 2).pick() == 2


def test_waiting_weighs_four_times_running():
    balancer = RankBalancer(2)
    # rank 0: 1 waiting, 0 running = 4; rank 1: 0 waiting, 3 running = 3 -> rank 1
    balancer.publish([(1, 0), (0, 3)])
    assert balancer.pick() == 1
    # rank 1 now 1 waiting + 3 running = 7 > 4 -> rank 0
    assert balancer.pick() == 0


def test_each_pick_counts_every_front_end():
    balancer = RankBalancer(2, 0, 3)
    balancer.pick()
    assert balancer.estimate() == [(3, 0), (0, 0)]


def test_a_publication_replaces_the_local_additions():
    balancer = RankBalancer(3)
    for _ in range(6):
        balancer.pick()
    assert balancer.estimate() == [(2, 0), (2, 0), (2, 0)]
    balancer.publish([(0, 5), (0, 1), (0, 2)], at=1.0)
    assert balancer.estimate() == [(0, 5), (0, 1), (0, 2)]
    assert balancer.published_at == 1.0
    assert balancer.pick() == 1


def test_stale_counts_send_a_burst_where_the_last_publication_pointed():
    # rank 0 looked empty at the last publication; rank 1 had 2 running: picks go to
    # rank 0 until its added waiting outweighs rank 1's running (4 > 2 after one)
    balancer = RankBalancer(2)
    balancer.publish([(0, 0), (0, 2)])
    assert [balancer.pick() for _ in range(4)] == [0, 1, 0, 1]


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="ranks"):
        RankBalancer(0)
    with pytest.raises(ValueError, match="client_index"):
        RankBalancer(2, 2, 2)
    with pytest.raises(ValueError, match="counts of 2 ranks"):
        RankBalancer(2).publish([(0, 0)])


def test_the_coordinator_publishes_changes_every_interval_and_sameness_rarely():
    c = Coordinator(interval=0.1, idle_interval=5.0)
    assert c.due(0.0, [(0, 0)])  # the first publication is due at once
    assert not c.due(0.05, [(1, 0)])  # changed, but within 100 ms
    assert c.due(0.1, [(1, 0)])  # changed, 100 ms on
    assert not c.due(0.3, [(1, 0)])  # unchanged: not before 5 s
    assert c.due(5.1, [(1, 0)])
    assert not c.due(5.15, [(2, 0)])  # changed again: the next publication 100 ms on
    assert c.due(5.2, [(2, 0)])
