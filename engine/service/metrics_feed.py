"""WatchMetrics: each replica's exposition pushed to a watcher as it changes, so that a
gateway answers a replica's /metrics from its own copy instead of calling GetMetrics per
scrape (an endpoint picker scrapes every replica every 50 ms; a call per scrape crosses two
busy processes each time).

Knows: the engine's metrics (MetricsRegistry: per replica a key of what its text depends on,
and the one render GetMetrics uses, so the bytes are the same), the engine-wide metrics
version (metrics.Versions) that orders a push against a Session batch, and asyncio.

The rule: a watch looks every `interval` seconds (DEFAULT_INTERVAL_S unless asked) at each
replica's key and sends, in one MetricsPush, the replicas whose key changed and the ones
that are gone (a full look; the first push holds every replica). A Session batch that
finished requests is stamped with the version as of its finishes and wakes every watch at
once for the replicas it finished them on (`Watchers.finished_on`): their texts are
rendered before the batch is written and sent as a partial push right behind it (only
those: a finish does not re-render the whole fleet); a Session on the lane carries that
push in the batch itself (ProgressBatch.metrics), since its batches overtake this stream,
and the watches get it only while some Session is on gRPC. A client that has read a batch stamped v waits for a copy of the replica at
seq >= v before it answers (read-your-finishes); otherwise its copy is at most `interval`
plus the delivery old. Nothing changed: nothing is sent, and a look whose engine-wide
version has not moved since the last (admissions and capacity or replica changes count too:
MetricsRegistry.touch) reads no key at all (one key read a second all the same, as a safety
net), so a scraped idle fleet costs next to nothing.

Does not know: HTTP, the gateway, what a series means.
"""

from __future__ import annotations

import asyncio
import math

from inference_lab.engine.metrics.exposition import MetricsRegistry
from inference_lab.v1 import engine_pb2 as pb

DEFAULT_INTERVAL_S = 0.04  # with the delivery, a copy is under 50 ms old
MIN_INTERVAL_S = 0.005
SAFETY_LOOK_S = 1.0  # a look at every key at least this often, even at an unchanged version


def watch_interval(asked: float) -> float | None:
    """The interval a WatchMetricsRequest asks for (0: the default); None when invalid."""
    if asked == 0:
        return DEFAULT_INTERVAL_S
    return asked if math.isfinite(asked) and asked >= MIN_INTERVAL_S else None


class Watchers:
    """Every open watch; `finished_on` renders the partial push of the replicas a Session
    batch finished requests on, before that batch is written, and hands it to each watch
    (so the push is not behind the batch by a render and a loop turn) or puts it in the
    batch itself (a Session on the lane, whose batches overtake the gRPC stream)."""

    __slots__ = ("metrics", "watches")

    def __init__(self, metrics: MetricsRegistry | None) -> None:
        self.metrics = metrics
        self.watches: set[_Watch] = set()

    def finished_on(self, engines: set[int], push: pb.MetricsPush, share: bool = True) -> bool:
        """Renders into `push` (seq = the version now) the replicas `engines` when anyone
        watches (else False: nothing rendered), and hands a copy to every watch if `share`
        (a gRPC Session's client reads it there; a lane Session's in its batch)."""
        if not self.watches or self.metrics is None:
            return False
        metrics = self.metrics
        push.seq, push.partial = metrics.versions.n, True  # read before rendering
        keys = metrics.replica_keys(engines)
        for index in keys:
            push.replicas.add(engine=index, text=metrics.render(None, [index]))
        if share:
            for w in self.watches:
                w.ready.append((push, keys))
                fut = w.fut
                if fut is not None and not fut.done():
                    fut.set_result(None)
        return True


class _Watch:
    __slots__ = ("fut", "ready")

    def __init__(self) -> None:
        self.fut: asyncio.Future | None = None  # set while it waits for its next look
        self.ready: list[tuple[pb.MetricsPush, dict]] = []  # partial pushes to send


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


async def watch(metrics: MetricsRegistry, watchers: Watchers, interval: float):
    """The pushes of one watch, forever (the RPC ends when the client cancels): a full look
    every `interval`, and between two, the partial pushes handed to it (Watchers)."""
    loop = asyncio.get_running_loop()
    me = _Watch()
    watchers.watches.add(me)
    try:
        sent: dict[int, tuple] = {}  # replica -> key of the text it has
        first = True
        looked, safety = -1, 0.0  # the version at the last full look; when to look anyway
        while True:
            seq = metrics.versions.n  # read before rendering
            if seq == looked and loop.time() < safety:  # nothing moved: no keys, no render
                keys = None
            else:
                looked, safety = seq, loop.time() + SAFETY_LOOK_S
                keys = metrics.replica_keys()
            push = pb.MetricsPush(seq=seq)
            for index, key in (keys or {}).items():
                if sent.get(index) != key:
                    sent[index] = key
                    push.replicas.add(engine=index, text=metrics.render(None, [index]))
            for index in [i for i in sent if keys is not None and i not in keys]:
                del sent[index]
                push.gone.append(index)
            if first or push.replicas or push.gone:
                first = False
                yield push
            next_full = loop.time() + interval
            while True:
                while me.ready:
                    partial, partial_keys = me.ready.pop(0)
                    sent.update(partial_keys)
                    yield partial
                if loop.time() >= next_full:
                    break
                me.fut = loop.create_future()
                timer = loop.call_at(next_full, _resolve, me.fut)
                try:
                    await me.fut
                finally:
                    timer.cancel()
                    me.fut = None
    finally:
        watchers.watches.discard(me)
