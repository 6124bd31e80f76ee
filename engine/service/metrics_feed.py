"""WatchMetrics: each replica's exposition pushed to a watcher as it changes, so that a
gateway answers a replica's /metrics from its own copy instead of calling GetMetrics per
scrape (an endpoint picker scrapes every replica every 50 ms; a call per scrape crosses two
busy processes each time).

Knows: the engine's metrics (EngineMetrics: per replica a key of what its text depends on,
and the one render GetMetrics uses, so the bytes are the same), the engine-wide metrics
version (metrics.Versions) that orders a push against a Session batch, and asyncio.

The rule: a watch looks every `interval` seconds (DEFAULT_INTERVAL_S unless asked) at each
replica's key and sends, in one MetricsPush, the replicas whose key changed and the ones
that are gone; the first push holds every replica. A Session batch that finished a request
is stamped with the version as of its finishes and wakes every watch at once
(`Watchers.wake`), so the push that shows those finishes leaves right behind the batch; a
client that has read a batch stamped v waits for a push with seq >= v before it answers
(read-your-finishes), and otherwise its copy is at most `interval` plus the delivery old.
Nothing changed: nothing is sent (the watch still wakes every interval to look).

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
    """The watches waiting for their next look: woken early by a Session batch that
    finished requests."""

    __slots__ = ("waiting",)

    def __init__(self) -> None:
        self.waiting: set[asyncio.Future] = set()

    def wake(self) -> None:
        waiting = self.waiting
        if waiting:
            for fut in waiting:
                if not fut.done():
                    fut.set_result(None)
            waiting.clear()

    async def wait(self, seconds: float) -> None:
        """Until `seconds` have passed or wake() is called."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.waiting.add(fut)
        timer = loop.call_later(seconds, _resolve, fut)
        try:
            await fut
        finally:
            timer.cancel()
            self.waiting.discard(fut)


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


async def watch(metrics: EngineMetrics, watchers: Watchers, interval: float):
    """The pushes of one watch, forever (the RPC ends when the client cancels)."""
    sent: dict[int, tuple] = {}  # replica -> key of the text it has
    first = True
    while True:
        push = pb.MetricsPush(seq=metrics.versions.n)  # before any render: a lower bound
        keys = metrics.replica_keys()
        for index, key in keys.items():
            if sent.get(index) != key:
                sent[index] = key
                push.replicas.add(engine=index, text=metrics.render(None, [index]))
        for index in [i for i in sent if i not in keys]:
            del sent[index]
            push.gone.append(index)
        if first or push.replicas or push.gone:
            first = False
            yield push
        await watchers.wait(interval)
