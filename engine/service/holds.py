"""The senders' holds: how far the engine may decide before arrivals still on their way.

Knows: each Session client's hold (SessionActions.hold_s: the oldest arrival stamp among
the requests it has read and not yet sent, on this machine's clock, 0 once it holds none)
and their minimum (`oldest`), which every pacer reads as its hold (engine.drivers.pacer:
no step starting later is booked until it moves, at most Pacer.MAX_TRAIL behind, on a
bounded queue). Only a
client on this machine's clock is heard (its stamps mean nothing here otherwise).
Does not know Sessions, pacers or messages: the service sets and clears the holds and is
told when the minimum moves on (`on_moved`: the pacers then look again).
"""

from __future__ import annotations

from collections.abc import Callable


class Holds:
    __slots__ = ("_by", "oldest", "on_moved")

    def __init__(self) -> None:
        self._by: dict[object, float] = {}  # sender -> its hold (time.monotonic())
        self.oldest: float | None = None  # the minimum: how far the engine may decide
        self.on_moved: Callable[[], None] | None = None  # the minimum moved on or went

    def set(self, sender: object, stamp: float | None) -> None:
        """`sender` holds arrivals since `stamp` (None: it holds none)."""
        by = self._by
        if stamp is None or not stamp > 0:  # (0 on the wire, or NaN: none held)
            if by.pop(sender, None) is None:
                return
        elif by.get(sender) == stamp:
            return
        else:
            by[sender] = stamp
        old = self.oldest
        new = self.oldest = min(by.values()) if by else None
        if old is not None and (new is None or new > old) and self.on_moved is not None:
            self.on_moved()
