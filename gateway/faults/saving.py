"""Saving the live fault settings (`--state-dir`) without holding up the event loop.

Knows: when the state is written and where the work runs. A change made through
/control/faults is written before the call is answered (`save`: in a worker thread, so
the loop serves every other request meanwhile); a script step used up by a generation
request (`changed`) is written at most once per DEBOUNCE_S, in a worker thread, so a
burst of requests costs one write, not one each, and a restart replays at most the steps
of that last fraction of a second. The snapshot is taken on the loop (the state is the
loop's); writes run one at a time, in order, the last one always with the latest state;
`flush` writes what is pending when the server stops.

Does not know: the file format (the `write` callable's, inference_lab.common.state_file)
or what the settings mean (gateway.faults.injection).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from inference_lab.gateway.faults.injection import FaultState

log = logging.getLogger("inference_lab.gateway.faults")

DEBOUNCE_S = 0.2  # script steps used up are saved within this long


class FaultSaver:
    """The one writer of a fault state's file, shared by every app that changes it."""

    def __init__(self, write: Callable[[dict[str, Any]], None],
                 debounce_s: float = DEBOUNCE_S) -> None:
        self.write = write  # takes a snapshot (a plain dict); runs in a worker thread
        self.debounce_s = debounce_s
        self._state: FaultState | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._lock: asyncio.Lock | None = None  # one write at a time (created on the loop)
        self._task: asyncio.Task | None = None  # the debounced write, once started

    def changed(self, state: FaultState) -> None:
        """`state` changed on the hot path: written within `debounce_s`, off the loop."""
        self._state = state
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.debounce_s, self._start)

    def _start(self) -> None:
        self._timer = None
        self._task = asyncio.get_running_loop().create_task(self._write_pending())

    async def _write_pending(self) -> None:
        if self._state is not None:
            await self.save(self._state)

    async def save(self, state: FaultState) -> None:
        """Write `state` now, in a worker thread (after any write under way)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._timer is not None:  # this write covers the pending one
                self._timer.cancel()
                self._timer = None
            snapshot = state.snapshot()
            try:
                await asyncio.get_running_loop().run_in_executor(None, self.write, snapshot)
            except OSError as exc:
                log.error("cannot save the fault settings: %s", exc)

    async def flush(self) -> None:
        """Write what is pending (the server is stopping)."""
        if self._timer is not None and self._state is not None:
            await self.save(self._state)
        task = self._task
        if task is not None and not task.done():
            await task
