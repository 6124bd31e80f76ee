"""Arrivals on their way into a core: what a sender handed over, and the order they wait in.

Knows an `Arrival` (the request's parameters, its sender's stamp and the instant it is
booked at, whom to tell the judgement, whether its sender let go) and `Arrivals`, the
arrivals not judged yet by instant, ties in the order they were handed over.

Does not know when an arrival may be judged, nor how: the pacer (engine.drivers.pacer)
takes them from here in time order with every step between, and queues or refuses each
at its instant.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from inference_lab.engine.sim.request import Request


class Arrival:
    """A request on its way into the core: judged (`decided(arrival, request, None)` or
    `decided(arrival, None, refusal)`) once the pacer's simulation reaches its instant."""

    __slots__ = ("prompt_len", "max_tokens", "tag", "priority", "token_ids", "n", "lora",
                 "stamp", "at", "decided", "withdrawn", "kv")

    def __init__(self, prompt_len: int, max_tokens: int | None, tag, *,
                 priority: int = 0, token_ids: bytes = b"", n: int = 1, lora=None,
                 stamp: float = 0.0, at: float = 0.0,
                 decided: Callable[["Arrival", Request | None, Exception | None], None],
                 kv=None) -> None:
        self.prompt_len, self.max_tokens, self.tag = prompt_len, max_tokens, tag
        self.priority, self.token_ids, self.n, self.lora = priority, token_ids, n, lora
        self.stamp = stamp  # the sender's stamp as modelled time (before any clamp)
        self.at = at  # the instant it is booked at, unless that is past (then later)
        self.decided = decided
        self.withdrawn = False  # its sender let go before it was judged
        self.kv = kv  # what it asks of the KV connector (engine.sim.kv_transfer.KvTransfer)


class Arrivals:
    """The arrivals not judged yet: a heap by (instant booked at, order handed over)."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Arrival]] = []
        self._seq = 0  # arrivals handed over so far: breaks ties between equal instants

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, arrival: Arrival) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (arrival.at, self._seq, arrival))

    def first(self) -> float | None:
        """The instant of the earliest arrival (sim time); None when none waits."""
        heap = self._heap
        return heap[0][0] if heap else None

    def pop(self) -> Arrival:
        """The earliest arrival, taken out (there must be one)."""
        return heapq.heappop(self._heap)[2]

    def take_all(self) -> list[Arrival]:
        """Every arrival, earliest first, and none left."""
        heap, self._heap = self._heap, []
        return [arrival for _, _, arrival in sorted(heap)]
