"""Which replica of a P/D pool (the prefill or the decode replicas) a router sends the next
request to, as vllm-router's P/D mode picks: `least_loaded` (the lowest load, the lowest
replica index on a tie) or `round_robin` (each replica in turn).

Knows the two policies. Does not know what a load is: the offline driver passes a core's
waiting + running, the experiment runner its own requests in flight on the replica.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

__all__ = ["PoolPicker"]


class PoolPicker:
    """One pool's picks: `ids` are its replicas' indices, in the pool's order."""

    __slots__ = ("ids", "policy", "_turn")

    def __init__(self, ids: Iterable[int], policy: str = "least_loaded") -> None:
        self.ids = list(ids)
        self.policy = policy
        self._turn = 0  # round robin's next position

    def pick(self, load: Callable[[int], int]) -> int:
        """The position in the pool of the replica the next request goes to; `load(i)`
        is the load of the replica at position i (asked only by least_loaded)."""
        n = len(self.ids)
        if n == 1:
            return 0
        if self.policy == "round_robin":
            i = self._turn
            self._turn = (i + 1) % n
            return i
        ids = self.ids
        return min(range(n), key=lambda i: (load(i), ids[i]))
