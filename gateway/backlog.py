"""The gateway's backlog: generation requests it has read and not yet sent to the engine.

Knows: one mark per connection holding such a request (the arrival stamp of its bytes,
time.monotonic()), and the oldest of them. The engine decides its modelled queue in the
order of arrival instants, and may decide an instant only once nothing stamped before it
can still come; the oldest mark is how far that is as far as this gateway knows (the
Session's hold, SessionActions.hold_s: engine.service.holds). A busy gateway that needs
hundreds of milliseconds of CPU to forward a burst therefore makes the engine's modelled
clock wait for it, instead of the engine deciding the burst's queue without the requests
it has not seen yet.

Marked by the edge (gateway.edge) when it reads a generation request whole (a body still
on its way is not an arrival yet: the edge marks it once the body is in). Released by two
owners, each through one path: the request's `Hold` (made and released at the end by the
app's middleware, gateway.middleware; released earlier by the generation path once the
request is sent, or before a scripted fault's slow reply), and the edge's connection
(gone, or a request refused by aiohttp's parser). `on_change(first)` is called when the oldest stamp changes: with first
True when the backlog goes from empty to not empty, so that the hold reaches the engine at
once rather than with the next message. A gateway with several engines (gateway.engines)
shares one backlog among their Sessions, each told through `listen`: a request read here
may go to any of them.

Does not know HTTP, the Session or the engine's messages.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable


class Backlog:
    __slots__ = ("_marks", "_heap", "_seq", "on_change", "_listeners")

    def __init__(self) -> None:
        self._marks: dict[object, tuple[float, int]] = {}  # connection -> (stamp, seq)
        self._heap: list[tuple[float, int, object]] = []  # (stamp, seq, connection), lazily pruned
        self._seq = 0
        self.on_change: Callable[[bool], None] | None = None  # the oldest moved (True: the first)
        self._listeners: list[Callable[[bool], None]] = []  # (listen: several Sessions)

    def listen(self, callback: Callable[[bool], None]) -> None:
        """Call `callback` as `on_change` is called (one more Session told of the hold)."""
        self._listeners.append(callback)
        self.on_change = callback if len(self._listeners) == 1 else self._tell_every

    def _tell_every(self, first: bool) -> None:
        for listener in self._listeners:
            listener(first)

    def __len__(self) -> int:
        return len(self._marks)

    def mark(self, key: object, stamp: float) -> None:
        """`key` holds a request that arrived at `stamp` (kept if it holds one already:
        the older stamp)."""
        marks = self._marks
        if key in marks:
            return
        heap = self._heap
        older = not marks or stamp < self.oldest()
        self._seq += 1
        marks[key] = (stamp, self._seq)
        heapq.heappush(heap, (stamp, self._seq, key))
        if older and self.on_change is not None:
            self.on_change(len(marks) == 1)

    def clear(self, key: object) -> None:
        """`key`'s request is sent or answered (a no-op when it holds none)."""
        held = self._marks.pop(key, None)
        if held is None:
            return
        if not self._marks:
            self._heap.clear()
        elif held[0] > self.oldest():
            return  # not the oldest: the hold stays
        if self.on_change is not None:
            self.on_change(False)

    def oldest(self) -> float | None:
        """The oldest stamp held, or None when nothing is held."""
        marks, heap = self._marks, self._heap
        while heap:
            stamp, seq, key = heap[0]
            if marks.get(key) == (stamp, seq):
                return stamp
            heapq.heappop(heap)
        return None


class Hold:
    """One HTTP request's hold on the backlog: its connection's mark (the key). `release`
    says the request is sent to the engine or answered without it: the connection's mark
    goes (a no-op when it holds none, so it may be called again)."""

    __slots__ = ("_backlog", "_key")

    def __init__(self, backlog: Backlog | None, key: object) -> None:
        self._backlog = backlog
        self._key = key

    def release(self) -> None:
        if self._backlog is not None:
            self._backlog.clear(self._key)
