"""The receiving end of each engine request: what the Session's dispatcher hands it.

Knows: a request's events (Admitted, then Finished per sequence or one Rejected), its token
total (a number, not a list of events: the hot path only moves an int), per sequence for
n > 1 (sequence i reports under the request's tag + i: `SequenceRoute`), the future a
handler awaits (cheaper than an asyncio.Queue), and the relay: a streaming handler sets
`RequestStream.writer`, and the dispatcher hands it each new total instead of waking the
handler's task, `RELAY_CHUNK` streams per loop callback (`relay_all`).

Two interfaces. The dispatcher's (gateway.transport.session; the engine client's
`cancel` too), which every route in a Session's table has (`Route`: a `RequestStream`, or
a `SequenceRoute` for sequence i > 0): `deliver` an Admitted, `deliver_last` a Finished
or Rejected, `progress` a new token total, `relay` the total to the route's `writer`, and
`fail` the route with an error. The handler's: `next_events`, `ready`, `total`, `done`,
and `writer` to set.

Does not know: the Session, its transports, or HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Callable, Protocol

from inference_lab.v1 import engine_pb2 as pb


class ClientGone(Exception):
    """The HTTP client went away; its engine request has been cancelled."""


class Route(Protocol):
    """What the Session's dispatcher hands a tag's events to (its routes table). A route
    whose `writer` is set is a RequestStream: the dispatcher sets its `total` and calls
    its `relay` (at once for the first tokens, else through `relay_all`)."""

    replica: int
    writer: Callable[[int], bool] | None

    def deliver(self, event: pb.Progress) -> None:
        """An event for the handler that is not the tag's last (Admitted)."""

    def deliver_last(self, event: pb.Progress) -> None:
        """The tag's last event: a Finished (one per sequence) or a Rejected."""

    def progress(self, total: int) -> None:
        """The engine has announced `total` tokens for the tag so far."""

    def fail(self, exc: BaseException) -> None:
        """No more events will come: the handler gets `exc` after what came before."""


class RequestStream:
    """The receiving end of one request (filled by the dispatcher): its Admitted,
    Finished or Rejected events, and `total`, the tokens the engine has announced so far
    (token progress is a number, not a list of events: the hot path only moves an int).

    `done` is True once no Cancel is needed any more: the engine finished or rejected it,
    the Session broke (the engine cancels on its side), or it was cancelled already.
    """

    __slots__ = ("tag", "model", "replica", "n", "done", "total", "totals", "writer",
                 "_finals", "_taken", "_events", "_waiter", "_error", "_loop")

    def __init__(self, tag: int, loop: asyncio.AbstractEventLoop, model: str = "",
                 n: int = 1, replica: int = 0) -> None:
        self.tag = tag
        self.model = model
        self.replica = replica
        self.n = n  # sequences: sequence i reports under tag + i
        self.done = False
        self.total = 0  # tokens announced by the engine so far (every sequence's)
        self.totals: list[int] | None = [0] * n if n > 1 else None  # per sequence, n > 1
        # Set by a handler that can take new tokens synchronously (n == 1): called with the
        # new total (`relay`, after the batch's woken tasks) instead of waking the
        # handler's task; returns False when it could not write (the task is woken then).
        self.writer: Callable[[int], bool] | None = None
        self._finals = 0  # Finished events received (one per sequence)
        self._taken = 0  # `total` as of the last next_events()
        self._events: list[pb.Progress] = []
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._loop = loop

    def deliver(self, event: pb.Progress) -> None:
        """An event for the handler (the dispatcher's: Admitted)."""
        self._events.append(event)
        self._wake()

    def deliver_last(self, event: pb.Progress) -> None:
        """A Finished (one per sequence) or a Rejected: the last event of its tag."""
        self._finals += 1
        if self._finals >= self.n or event.HasField("rejected"):
            self.done = True
        self.deliver(event)

    def progress(self, total: int) -> None:
        """The engine's token total for the request (for sequence 0 when n > 1)."""
        if self.totals is not None:
            self.sequence_progress(0, total)
        elif total > self.total:
            self.total = total
            self._wake()

    def relay(self) -> None:
        """Hand `total` to the writer (the dispatcher's relay), else wake the task."""
        writer = self.writer
        if writer is not None and not self._events and writer(self.total):
            self._taken = self.total  # written: nothing for the task to do
        else:
            self._wake()

    def sequence_progress(self, index: int, total: int) -> None:
        """Sequence `index`'s token total (n > 1); `total` is the sum over sequences."""
        old = self.totals[index]
        if total > old:
            self.totals[index] = total
            self.total += total - old
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def fail(self, exc: BaseException) -> None:
        """End the request with `exc` (raised by `next_events` after what came before):
        the Session broke, or the request was cancelled."""
        self.done = True
        if self._error is None:
            self._error = exc
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def ready(self) -> bool:
        """`next_events()` would return (or raise) without waiting."""
        return bool(self._events) or self.total != self._taken or self._error is not None

    async def next_events(self) -> list[pb.Progress]:
        """Every event received since the last call, returning once there is an event or
        `total` has grown; what arrived before a failure is delivered first, then the
        failure is raised."""
        while not self._events and self.total == self._taken:
            if self._error is not None:
                raise self._error
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        self._taken = self.total
        events = self._events
        self._events = []
        return events


async def any_ready(streams: Sequence[RequestStream]) -> None:
    """Wait until one of `streams` is `ready` (one future, woken by whichever moves first:
    the requests of one HTTP request of several prompts)."""
    if any(stream.ready for stream in streams):
        return
    waiter = asyncio.get_running_loop().create_future()
    for stream in streams:
        stream._waiter = waiter
    try:
        await waiter
    finally:
        for stream in streams:
            if stream._waiter is waiter:
                stream._waiter = None


class SequenceRoute:
    """The route of sequence `index` > 0 of a request with n > 1 (its tag is the
    request's tag + index): what the dispatcher hands it goes to the request's stream."""

    __slots__ = ("stream", "index", "replica")
    writer = None  # (its request's stream is written by its handler: n > 1)

    def __init__(self, stream: RequestStream, index: int) -> None:
        self.stream = stream
        self.index = index
        self.replica = stream.replica

    def progress(self, total: int) -> None:
        self.stream.sequence_progress(self.index, total)

    def deliver(self, event: pb.Progress) -> None:
        self.stream.deliver(event)

    def deliver_last(self, event: pb.Progress) -> None:
        self.stream.deliver_last(event)

    def fail(self, exc: BaseException) -> None:
        self.stream.fail(exc)


RELAY_CHUNK = 16  # streams written per loop callback (a scrape can go in between)


def relay_all(streams: list[RequestStream], start: int = 0,
              then: Callable[[], None] | None = None) -> None:
    """Writes streams[start:start + RELAY_CHUNK], and leaves the rest to the loop's next
    iteration: a whole batch's writes in one callback would keep everything else this
    gateway answers (a /metrics scrape, a refusal) waiting behind them. `then` runs once
    the last stream is written."""
    end = start + RELAY_CHUNK
    for stream in streams[start:end]:
        stream.relay()
    if end < len(streams):
        asyncio.get_running_loop().call_soon(relay_all, streams, end, then)
    elif then is not None:
        then()
