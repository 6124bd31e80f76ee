"""Data-parallel internal load balancing as vLLM's front ends do it.

Knows: how one front end (an API server) picks the data-parallel rank of a request that
names none, from per-rank (waiting, running) counts that a coordinator publishes now and
then, and when that coordinator publishes. The rule, from vLLM's DP client
(`vllm/v1/engine/core_client.py`, `DPLBAsyncMPClient.get_core_engine_for_request`) and
its coordinator (`vllm/v1/engine/coordinator.py`):

- score = 4 x waiting + running (a waiting request costs the TTFT of everything behind
  it; a running one only a little TPOT); the lowest score wins, ties going to the first
  rank met when counting from this front end's start index, (ranks x client_index) //
  client_count, so that idle ranks are shared out among front ends;
- between publications the front end adds `client_count` to the chosen rank's waiting
  count (it assumes every front end sent one there too), so a burst spreads instead of
  landing on the rank that looked idlest at the last publication;
- a publication replaces the front end's estimate wholesale: what it added locally is
  forgotten, and the counts are as old as the publication (stale under a burst);
- the coordinator publishes every PUBLISH_INTERVAL_S (100 ms, vLLM's
  `stats_update_interval_ms`) while the counts change, else every IDLE_PUBLISH_S (5 s).

Does not know: clocks, sockets, engines or requests: callers pass the time and the counts
(the gateway from its engines' replies, the offline driver from its cores), so the wall-
clock lab and the simulators take the same decisions from the same counts.
"""

from __future__ import annotations

from collections.abc import Sequence

WAITING_WEIGHT = 4  # vLLM's score: waiting * 4 + running
PUBLISH_INTERVAL_S = 0.1  # vLLM's stats_update_interval_ms default (100) while counts change
IDLE_PUBLISH_S = 5.0  # the coordinator's wait when nothing changed


class RankBalancer:
    """One front end's estimate of every rank's load, and its choice of rank."""

    __slots__ = ("ranks", "client_count", "start", "_counts", "published_at")

    def __init__(self, ranks: int, client_index: int = 0, client_count: int = 1) -> None:
        if ranks < 1:
            raise ValueError(f"ranks must be at least 1, got {ranks}")
        if not 0 <= client_index < client_count:
            raise ValueError(f"client_index must be in [0, {client_count}), got {client_index}")
        self.ranks = ranks
        self.client_count = client_count
        self.start = (ranks * client_index) // client_count
        self._counts = [[0, 0] for _ in range(ranks)]  # rank -> [waiting, running] estimate
        self.published_at: float | None = None  # when the estimate was last replaced

    def publish(self, counts: Sequence[tuple[int, int]], at: float | None = None) -> None:
        """The coordinator's (waiting, running) of every rank, as of `at`: the estimate
        becomes exactly that (local additions since the last publication are dropped)."""
        if len(counts) != self.ranks:
            raise ValueError(f"expected counts of {self.ranks} ranks, got {len(counts)}")
        self._counts = [[int(w), int(r)] for w, r in counts]
        self.published_at = at

    def estimate(self) -> list[tuple[int, int]]:
        """The (waiting, running) this front end believes each rank has."""
        return [(w, r) for w, r in self._counts]

    def pick(self) -> int:
        """The rank of the next request that names none; counts it as waiting there."""
        counts = self._counts
        best, best_score = self.start, None
        for i in range(self.ranks):
            rank = (self.start + i) % self.ranks
            waiting, running = counts[rank]
            score = waiting * WAITING_WEIGHT + running
            if best_score is None or score < best_score:
                best, best_score = rank, score
        counts[best][0] += self.client_count
        return best


class Coordinator:
    """When the coordinator publishes: every PUBLISH_INTERVAL_S while the counts move,
    every IDLE_PUBLISH_S while they do not. Told the time and the counts."""

    __slots__ = ("interval", "idle_interval", "_last", "_at")

    def __init__(self, interval: float = PUBLISH_INTERVAL_S,
                 idle_interval: float = IDLE_PUBLISH_S) -> None:
        if interval <= 0 or idle_interval < interval:
            raise ValueError("the publish interval must be > 0 and at most the idle one")
        self.interval = interval
        self.idle_interval = idle_interval
        self._last: tuple | None = None  # the counts last published
        self._at: float | None = None  # when

    def due(self, now: float, counts: Sequence[tuple[int, int]]) -> bool:
        """True when a publication of `counts` is due at `now` (then it is taken as made)."""
        snapshot = tuple(tuple(c) for c in counts)
        if self._at is not None:
            wait = self.interval if snapshot != self._last else self.idle_interval
            if now < self._at + wait:
                return False
        self._last, self._at = snapshot, now
        return True
