"""WatchMetrics: each replica's exposition pushed to a watcher as it changes, so that a
gateway answers a replica's /metrics from its own copy instead of calling GetMetrics per
scrape (an endpoint picker scrapes every replica every 50 ms; a call per scrape crosses two
busy processes each time).

Knows: the engine's metrics (EngineMetrics: per replica a key of what its text depends on,
and the one render GetMetrics uses, so the bytes are the same), the engine-wide metrics
version (metrics.Versions) that orders a push against a Session batch, and asyncio.

The rule: a watch looks every `interval` seconds (DEFAULT_INTERVAL_S unless asked) at each
replica's key and sends, in one MetricsPush, the replicas whose key changed and the ones
that are gone (a full look; the first push holds every replica). A Session batch that
finished requests is stamped with the version as of its finishes and wakes every watch at
once for the replicas it finished them on (`Watchers.wake`): a partial look sends those
replicas' texts right behind the batch (and only those: a finish does not re-render the
whole fleet). A client that has read a batch stamped v waits for a copy of the replica at
seq >= v before it answers (read-your-finishes); otherwise its copy is at most `interval`
plus the delivery old. Nothing changed: nothing is sent (the watch still looks every
interval).

Does not know: HTTP, the gateway, what a series means.
"""

from __future__ import annotations

import asyncio
import math

from inference_lab.engine.service.metrics import EngineMetrics
from inference_lab.v1 import engine_pb2 as pb

DEFAULT_INTERVAL_S = 0.04  # with the delivery, a copy is under 50 ms old
MIN_INTERVAL_S = 0.005


def watch_interval(asked: float) -> float | None:
    """The interval a WatchMetricsRequest asks for (0: the default); None when invalid."""
    if asked == 0:
        return DEFAULT_INTERVAL_S
    return asked if math.isfinite(asked) and asked >= MIN_INTERVAL_S else None


class Watchers:
    """The watches waiting for their next look: woken early, for the replicas named, by a
    Session batch that finished requests on them."""

    __slots__ = ("waiting",)

    def __init__(self) -> None:
        self.waiting: set[_Wait] = set()

    def wake(self, engines: set[int]) -> None:
        for wait in self.waiting:
            wait.urgent |= engines
            if not wait.fut.done():
                wait.fut.set_result(None)


class _Wait:
    __slots__ = ("fut", "urgent")

    def __init__(self, fut: asyncio.Future) -> None:
        self.fut = fut
        self.urgent: set[int] = set()


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


async def watch(metrics: EngineMetrics, watchers: Watchers, interval: float):
    """The pushes of one watch, forever (the RPC ends when the client cancels): a full look
    every `interval`, and between two, a partial one at once for the replicas a Session
    batch finished requests on."""
    loop = asyncio.get_running_loop()
    sent: dict[int, tuple] = {}  # replica -> key of the text it has
    first, urgent = True, None  # urgent: None = a full look
    next_full = loop.time()
    while True:
        push = pb.MetricsPush(seq=metrics.versions.n, partial=urgent is not None)
        keys = metrics.replica_keys(urgent)  # (the version is read first: a lower bound)
        for index, key in keys.items():  # (a partial look sends its replicas whatever)
            if sent.get(index) != key or urgent is not None:
                sent[index] = key
                push.replicas.add(engine=index, text=metrics.render(None, [index]))
        if urgent is None:
            next_full = loop.time() + interval
            for index in [i for i in sent if i not in keys]:
                del sent[index]
                push.gone.append(index)
        if first or push.replicas or push.gone:
            first = False
            yield push
        wait = _Wait(loop.create_future())
        watchers.waiting.add(wait)
        timer = loop.call_at(next_full, _resolve, wait.fut)
        try:
            await wait.fut
        finally:
            timer.cancel()
            watchers.waiting.discard(wait)
        urgent = wait.urgent if wait.urgent and loop.time() < next_full else None
