"""The lockstep of an MoE model's data-parallel ranks, as one rank's pacer sees it.

Knows vLLM's rule for MoE data parallelism: the expert layers synchronise every forward
pass, so the ranks step together. A step of the group lasts as long as its slowest rank's
(a rank done early waits for the others' collectives); while any rank has work, every
rank steps, an idle one running a dummy pass (so a request that reaches an idle rank
waits for the group's step in flight to end before its own first step). Here each rank
runs in an engine process of its own, on the wall clock: a rank tells its peers each step
it books (its start and end, as time.monotonic() instants, one clock for every process of
the machine), and from what they tell it, `Lockstep` says
- `aligned_end(start, end)`: when a step this rank booked at `start` ends: the latest end
  of the steps booked at that instant, its own included;
- `covering(t)`: whether the group is in a step that started before `t` (then the rank
  joined it as a dummy pass, and its own step waits for that step's end);
and counts the dummy passes. The pacer applies the answers (engine.drivers.pacer);
announcements reach the peers within a few tens of microseconds on one host, far inside
a step, so a step is extended before its own end; one that crosses a peer's step already
under way (both booked within that delay) is put back in line at the next boundary.

Does not know sockets (engine.service.lockstep carries the announcements) or the core.
A dummy pass is the cheapest step there is, so it never outlasts a real step and is not
announced.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

SAME = 1e-6  # wall s: two ranks' steps booked at instants this close are one group step
KEEP = 16  # the peers' latest steps remembered (a few group steps of a few ranks)


class Lockstep:
    """One rank's record of its peers' steps, and the rule of the group's step."""

    __slots__ = ("_send", "_steps", "dummy_passes", "_last_start")

    def __init__(self, send: Callable[[float, float], None]) -> None:
        self._send = send  # tells every peer (start, end) of a step this rank booked
        self._steps: deque[tuple[float, float]] = deque(maxlen=KEEP)  # peers' latest (wall)
        self.dummy_passes = 0
        self._last_start = float("-inf")  # the latest group step start heard of

    def announce(self, start: float, end: float) -> None:
        self._send(start, end)

    def peer(self, start: float, end: float) -> bool:
        """A peer booked a step [start, end); True when it is a group step not heard of
        before (several peers announce each one)."""
        self._steps.append((start, end))
        new = abs(start - self._last_start) > SAME
        if start > self._last_start:
            self._last_start = start
        return new

    def aligned_end(self, start: float, end: float) -> float:
        """The end of the group's step that this rank booked at `start` to end at `end`."""
        for s, e in self._steps:
            if abs(s - start) <= SAME and e > end:
                end = e
        return end

    def covering(self, t: float) -> float | None:
        """The end of the group's step in flight at `t` that started before it (None when
        no peer's step covers `t`): a step of this rank may not start before then."""
        out = None
        for s, e in self._steps:
            if s < t - SAME and e > t + SAME and (out is None or e > out):
                out = e
        return out
