"""The gateway's copy of the engine's admission state, and the refusals it makes on it.

Knows: the engine announces on the Session whenever a queue (a model's replica) becomes
full or stops being full (`QueueState`, with the refusal's text), and while full the span
of arrival instants over which it provably stays full (from when it filled to the end of
the step in flight: the queue's fullness changes only at step boundaries and by arrivals,
engine.sim.core `saturation`). A request of one sequence whose arrival stamp lies in that
span, and which is within the largest request the engine says the model takes
(`ModelInfo.max_request_tokens`: the engine's checks come before its queue's), is refused
here with the engine's own text, and the refusal is reported back (`Refused`, batched every
REFUSED_REPORT_S) so the engine's rejection metrics still count every refusal. Everything
else goes to the engine, which judges it at its arrival instant: a stamp outside the span,
a "full" without a span (an engine on another clock), a request too large for the model
(its 400), and every request of n > 1 sequences, whose KV-cache rule only the engine
applies (its 400 or its 529).

One copy per Session: a Session that breaks forgets it (`close`).

Does not know: the Session's transports, HTTP, or how a refusal is rendered.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from inference_lab.v1 import engine_pb2 as pb

REFUSED_REPORT_S = 0.01  # refusals made here reach the engine's metrics within this


def queue_key(model: str, replica: int = 0) -> str:
    """Whose queue state: the model's name for replica 0, `model@i` for replica i."""
    return f"{model}@{replica}" if replica else model


class AdmissionCopy:
    """The engine's last word on each queue that is full (with its span), and the count
    of refusals made on it, not yet reported. `send` queues a Session action."""

    __slots__ = ("saturated", "closed", "_refused", "_send", "_loop")

    def __init__(self, send: Callable[[pb.SessionAction], None],
                 loop: asyncio.AbstractEventLoop) -> None:
        # queue_key(model, replica) -> the engine's last QueueState for it, while "saturated"
        self.saturated: dict[str, pb.QueueState] = {}
        self.closed = False
        self._refused: dict[tuple[str, int], int] = {}  # refusals made here, not yet reported
        self._send = send
        self._loop = loop

    def set(self, state: pb.QueueState) -> None:
        """The engine's announcement (or a capacity reply's "not full")."""
        key = queue_key(state.model, state.replica)
        if state.saturated and state.HasField("until_monotonic_s"):
            self.saturated[key] = state
        else:  # (full without a span: this gateway cannot know until when; ask the engine)
            self.saturated.pop(key, None)

    def refusal(self, model: str, replica: int, arrived: float | None, tokens: int, n: int,
                largest: Callable[[str], int | None]) -> str | None:
        """The engine's saturation message when a request of `n` sequences and `tokens`
        tokens (prompt + cap), which arrived at `arrived` (time.monotonic(); None: now),
        is refused here: its stamp lies in the span over which the engine's last word says
        the queue is full (the refusal is then counted for the `Refused` report); else
        None. `largest(model)`: the largest request the engine says the model takes."""
        full = self.saturated.get(queue_key(model, replica))
        if full is None:
            return None
        stamp = time.monotonic() if arrived is None else arrived
        if not full.since_monotonic_s <= stamp < full.until_monotonic_s:
            return None  # (outside the span: the engine judges it at its instant)
        if n != 1:
            return None  # (the engine's KV-cache rule for n sequences is its own to apply)
        limit = largest(model)
        if limit is None or tokens > limit:
            return None  # (one that can never fit goes on: the engine answers its 400 first)
        self.note_refused((model, replica))
        return full.message

    def may_refuse(self, arrived: float | None) -> bool:
        """Whether some queue's "full" span covers an arrival at `arrived` (None: now)."""
        if not self.saturated:
            return False
        stamp = time.monotonic() if arrived is None else arrived
        return any(full.since_monotonic_s <= stamp < full.until_monotonic_s
                   for full in self.saturated.values())

    def note_refused(self, key: tuple[str, int]) -> None:
        """Count a refusal made on the engine's word; reported in one action per model
        and replica."""
        refused = self._refused
        if not refused:
            self._loop.call_later(REFUSED_REPORT_S, self._report_refused)
        refused[key] = refused.get(key, 0) + 1

    def _report_refused(self) -> None:
        refused, self._refused = self._refused, {}
        if self.closed:
            return
        for (model, replica), count in refused.items():
            action = pb.SessionAction()
            action.refused.model = model
            action.refused.count = count
            if replica:
                action.refused.replica = replica
            self._send(action)

    def close(self) -> None:
        """The Session broke: nobody vouches for these states any more."""
        self.closed = True
        self.saturated.clear()
