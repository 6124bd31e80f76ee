"""Virtual time: the experiment runner, unchanged, on a simulated clock, against a
simulated fleet that answers the same requests a served lab answers.

- `VirtualLoop`: an asyncio event loop whose `time()` is the simulated clock. When no
  callback is ready it jumps the clock to the earliest timer instead of waiting, so
  sleeps, timeouts and timers cost no wall time; nothing else changes (tasks, futures,
  `call_at`). Waiting with no timer at all is a deadlock and raises.
- `VirtualLab` (experiments.virtual_lab): the replicas of one model, each an EngineCore
  stepped on that loop as the offline driver steps it, under the fleet's own rules
  (engine.fleet.rules), answering the control plane the runner uses with the served
  lab's rows, error envelopes (common.error_table) and metric series (engine.metrics):
  a request to a replica that is not ready is a 503, one the full queue refuses a 529.
- `VirtualBackend`: the runner's clock, timer, control client and endpoints over them.

Every response carries the engine's modelled timings, and the client's measurements are
those same instants (no network, no gateway): TTFT is the end of the step that made the
first token, e2e the end of the last one.

Knows asyncio's loop interface and the runner's backend interface. Does not know
sockets or HTTP framing (requests are handed over as objects).
"""

from __future__ import annotations

import asyncio
import selectors
from dataclasses import dataclass
from urllib.parse import urlsplit

from inference_lab.experiments.client import Result
from inference_lab.experiments.virtual_lab import BASE_PORT, VirtualLab

__all__ = ["VirtualLoop", "VirtualLab", "VirtualBackend", "VirtualTimeError", "BASE_PORT"]


class VirtualTimeError(RuntimeError):
    """The run waited with nothing scheduled: no event could ever wake it."""


class _Selector(selectors.SelectSelector):
    """Registers file objects as any selector does but never waits: `select(timeout)`
    moves the loop's clock forward by `timeout` and reports no I/O."""

    def __init__(self, loop: "VirtualLoop") -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout=None):
        if timeout is None:
            raise VirtualTimeError("virtual time: the run waits for something no timer or "
                                   "step will ever bring")
        if timeout > 0:
            self._loop.advance(timeout)
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(selector=_Selector(self))

    def time(self) -> float:
        return self._now

    def horizon(self) -> float:
        """The earliest instant another callback may run at: now while any is ready, else
        the earliest timer's (inf: none). Read from asyncio's own queues (BaseEventLoop's
        `_ready` and `_scheduled`); a loop without them gives now (no running ahead)."""
        ready, scheduled = getattr(self, "_ready", None), getattr(self, "_scheduled", None)
        if ready is None or scheduled is None or ready:
            return self._now
        return scheduled[0].when() if scheduled else float("inf")

    def advance(self, seconds: float) -> None:
        # `seconds` is the earliest timer's instant less now: the sum lands within a
        # rounding error of it, well inside the loop's clock resolution (1 ns)
        self._now += seconds


class VirtualTimer:
    """alarm.Timer's interface on the loop's own timers."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback) -> None:
        self.loop, self.callback = loop, callback
        self.handle = None

    def arm(self, when: float) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.handle = self.loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self.handle = None
        self.callback()

    def close(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


@dataclass(slots=True)
class Job:
    """One request as the virtual endpoint hands it over."""

    prompt_tokens: int
    max_tokens: int
    token_ids: bytes
    model: str  # "" = the base model, else a LoRA adapter


class VirtualConnection:
    """client.Connection's interface: one request at a time, answered by the lab."""

    __slots__ = ("lab", "port", "on_done", "ctx", "closed", "busy")

    def __init__(self, lab: "VirtualLab", port: int) -> None:
        self.lab, self.port = lab, port
        self.on_done = None
        self.ctx = None
        self.closed = False
        self.busy = False

    def start(self, job: Job, on_done, ctx=None) -> None:
        self.on_done, self.ctx, self.busy = on_done, ctx, True
        self.lab.submit(self.port, job, self)

    def send(self, job: Job) -> asyncio.Future:
        waiter = self.lab.loop.create_future()
        self.start(job, _resolve, waiter)
        return waiter

    def close(self) -> None:
        self.closed = True

    def done(self, result: Result) -> None:
        self.busy = False
        on_done = self.on_done
        self.on_done = None
        on_done(self, result)


def _resolve(conn: VirtualConnection, result: Result) -> None:
    waiter = conn.ctx
    if not waiter.done():
        waiter.set_result(result)


class VirtualEndpoint:
    """client.Endpoint's interface for one replica port."""

    def __init__(self, lab: "VirtualLab", port: int) -> None:
        self.lab, self.port = lab, port

    def build(self, prompt, max_tokens: int, serial: int) -> Job:
        return Job(prompt.tokens, max_tokens, prompt.ids, prompt.adapter)

    async def connect(self) -> VirtualConnection:
        return VirtualConnection(self.lab, self.port)


class VirtualHttp:
    """The runner's control-plane client (runner.Http's interface) over the lab."""

    def __init__(self, lab: VirtualLab) -> None:
        self.lab = lab

    async def request(self, method: str, url: str, body: dict | None = None,
                      timeout: float = 5.0) -> tuple[int, bytes]:
        return self.lab.request(method, url, body)


class VirtualBackend:
    """What the runner needs of a lab, in virtual time."""

    virtual = True

    def __init__(self, lab: VirtualLab) -> None:
        self.lab = lab
        self.base_url = f"http://virtual:{BASE_PORT}"
        self.http = VirtualHttp(lab)
        self.clock = lab.loop.time

    def timer(self, loop, callback) -> VirtualTimer:
        return VirtualTimer(loop, callback)

    def endpoint(self, url: str) -> VirtualEndpoint:
        return VirtualEndpoint(self.lab, urlsplit(url).port or BASE_PORT)
