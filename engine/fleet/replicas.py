"""The replica set of one engine process: N independent replicas of every served model.

Knows: which replicas each model has (an index per replica; its gateway port is the base
port + index), when each becomes ready (created + its start-up delay, read against the
loop clock when asked: no timer, no CPU while idle), and the lifecycle of a drained one
(stops admitting at once, finishes what it holds, then is closed and forgotten). Adding
takes the lowest free indices; draining takes the highest active ones. `scale(model, 0)`
drains every replica of a model: it then answers "unavailable" until one is ready again.

Several engine processes may share one fleet's indices (`serve --engine-processes P`, or
one data-parallel rank a process): a process then holds the indices of its `Shard` (i
mod P = p), and a count asked of it (`scale(model, N)`) is the fleet's: it keeps those of
the first N indices that are its own, so P processes told the same N hold N replicas
between them, each index in exactly one process.

Does not know: what a replica runs on. The service layer passes a factory returning a
runtime with `start()`, `open_streams() -> int`, `async drained()` (resolves once it holds
no request) and `async stop()`; the fleet only orders their lifecycle.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from inference_lab.engine.sim.specs import Deployment

log = logging.getLogger(__name__)

# The most replicas one model may hold in one engine process, draining ones included:
# replica indices run 0 .. MAX_REPLICAS - 1 (each index also needs a gateway port: base
# port + index).
MAX_REPLICAS = 64


class ReplicaNotFound(LookupError):
    """No such replica of that model (NOT_FOUND / HTTP 404)."""


class ReplicaUnavailable(Exception):
    """The replica exists but admits nothing now (UNAVAILABLE / HTTP 503): still starting,
    draining, or the model has no replica left. `reason` is machine-readable."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


@dataclass(slots=True, eq=False)
class Replica:
    model: str
    index: int
    runtime: Any
    ready_at: float  # loop time at which its start-up delay has passed
    draining: bool = False

    def ready(self, now: float) -> bool:
        return not self.draining and now >= self.ready_at

    def ready_in(self, now: float) -> float:
        return 0.0 if self.draining else max(self.ready_at - now, 0.0)


@dataclass(frozen=True, slots=True)
class Shard:
    """The replica indices one engine process holds: those with index mod `of` = `part`
    (the whole fleet: 0 of 1)."""

    part: int = 0
    of: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.part < self.of:
            raise ValueError(f"a shard is part p of P with 0 <= p < P, got {self.part} of {self.of}")

    def owns(self, index: int) -> bool:
        return index % self.of == self.part

    def share(self, replicas: int) -> int:
        """How many of the fleet's first `replicas` indices are this shard's."""
        return len(range(self.part, replicas, self.of))


class Fleet:
    """Every replica of every model, by model then index."""

    def __init__(self, deployments: list[Deployment], make_runtime: Callable[[Deployment, int], Any],
                 startup_delay: Callable[[Deployment], float],
                 on_change: Callable[[], None] | None = None,
                 max_replicas: int = MAX_REPLICAS, shard: Shard = Shard()) -> None:
        self.deployments = {d.name: d for d in deployments}
        self.max_replicas = max_replicas
        self.shard = shard
        self._make = make_runtime
        self._delay = startup_delay
        self._on_change = on_change  # the set of replicas changed (sessions, listeners)
        self.replicas: dict[str, dict[int, Replica]] = {d.name: {} for d in deployments}
        self.version = 0  # counts changes of the replica set
        self._drains: set[asyncio.Task] = set()
        self._loop = asyncio.get_running_loop()

    # ---- reading ---------------------------------------------------------------------
    def now(self) -> float:
        return self._loop.time()

    def __iter__(self) -> Iterator[Replica]:
        for replicas in self.replicas.values():
            yield from replicas.values()

    def runtimes(self) -> list[Any]:
        return [r.runtime for r in self]

    def indices(self) -> set[int]:
        """Every replica index some model has (draining ones included)."""
        return {i for replicas in self.replicas.values() for i in replicas}

    def lookup(self, model: str, index: int) -> Replica:
        """The replica that may admit a request now; raises ReplicaNotFound or
        ReplicaUnavailable. (An unknown model is the caller's to report.)"""
        replicas = self.replicas[model]
        replica = replicas.get(index)
        if replica is None:
            if not any(not r.draining for r in replicas.values()):
                raise ReplicaUnavailable(
                    "NO_REPLICA", f"model {model!r} has no replica (scaled to 0): "
                    "503 until one is added and ready")
            raise ReplicaNotFound(f"model {model!r} has no replica {index} "
                                  f"(replicas: {', '.join(map(str, sorted(replicas)))})")
        if replica.draining:
            raise ReplicaUnavailable("REPLICA_DRAINING",
                                     f"replica {index} of {model!r} is draining")
        now = self.now()
        if now < replica.ready_at:
            raise ReplicaUnavailable(
                "REPLICA_NOT_READY", f"replica {index} of {model!r} is starting: ready in "
                f"{replica.ready_at - now:.1f} s")
        return replica

    def select(self, model: str, index: int | None) -> list[Replica]:
        """Replicas of `model` (every model when empty; KeyError for an unknown one),
        one index or all; ReplicaNotFound when that index selects nothing."""
        names = [model] if model else list(self.replicas)
        chosen = []
        for name in names:
            replicas = self.replicas[name]
            if index is None:
                chosen.extend(replicas[i] for i in sorted(replicas))
            elif index in replicas:
                chosen.append(replicas[index])
        if index is not None and not chosen:
            raise ReplicaNotFound(f"no replica {index}"
                                  + (f" of model {model!r}" if model else " of any model"))
        return chosen

    # ---- changing ---------------------------------------------------------------------
    def _new_indices(self, name: str, count: int) -> list[int]:
        """The indices `_add(name, count)` takes: the lowest free ones of this shard (a
        draining replica keeps its index, and its port, until it has closed)."""
        current, out, index = self.replicas[name], [], self.shard.part
        while len(out) < count:
            if index not in current:
                out.append(index)
            index += self.shard.of
        return out

    def check_count(self, replicas: int, model: str = "") -> None:
        """ValueError unless `model` (every model when empty; KeyError for an unknown one)
        can have `replicas` active replicas, every replica it holds counted: scaling up
        while some still drain takes new indices, and no index reaches max_replicas."""
        if not 0 <= replicas <= self.max_replicas:
            raise ValueError(f"replicas must be between 0 and {self.max_replicas}, got {replicas}")
        own = self.shard.share(replicas)
        for name in [model] if model else list(self.replicas):
            current = self.replicas[name]
            active = sum(not r.draining for r in current.values())
            new = self._new_indices(name, max(own - active, 0))
            if new and new[-1] >= self.max_replicas:
                raise ValueError(
                    f"{name} holds {len(current)} replicas ({len(current) - active} draining): "
                    f"{replicas} active would need replica index {new[-1]}, and at most "
                    f"{self.max_replicas} replicas may be held at once (indices 0 to "
                    f"{self.max_replicas - 1}); retry once the draining ones have closed")

    def scale(self, model: str, replicas: int) -> list[Replica]:
        """Give `model` (every model when empty; KeyError for an unknown one) `replicas`
        active replicas (this shard's share of them); returns the selected models'
        replicas afterwards."""
        names = [model] if model else list(self.replicas)
        for name in names:
            self.replicas[name]  # KeyError before any change
        self.check_count(replicas, model)
        replicas = self.shard.share(replicas)
        for name in names:
            current = self.replicas[name]
            active = sorted(i for i, r in current.items() if not r.draining)
            if len(active) < replicas:
                self._add(name, replicas - len(active))
            for index in reversed(active[replicas:]):
                self._drain(current[index])
        self._changed()
        return self.select(model, None)

    def _add(self, name: str, count: int) -> None:
        deployment = self.deployments[name]
        current = self.replicas[name]
        delay = self._delay(deployment)
        for index in self._new_indices(name, count):
            runtime = self._make(deployment, index)
            runtime.start()
            current[index] = Replica(name, index, runtime, self.now() + delay)
            log.info("replica %d of %s added (ready in %.1f s)", index, name, delay)

    async def restart(self, index: int) -> list[Replica]:
        """Replica `index` of every model that has it (ReplicaNotFound when none does)
        crashed: each stops now (its runtime ends what it holds) and a fresh one takes its
        place, ready after its start-up delay. A draining one is left to finish."""
        chosen = [r for r in self.select("", index) if not r.draining]
        for old in chosen:
            await old.runtime.stop()
            runtime = self._make(self.deployments[old.model], index)
            runtime.start()
            delay = self._delay(self.deployments[old.model])
            self.replicas[old.model][index] = Replica(old.model, index, runtime,
                                                      self.now() + delay)
            log.info("replica %d of %s restarted (ready in %.1f s)", index, old.model, delay)
        self._changed()
        return chosen

    def _drain(self, replica: Replica) -> None:
        replica.draining = True
        log.info("replica %d of %s draining (%d in flight)", replica.index, replica.model,
                 replica.runtime.open_streams())
        task = self._loop.create_task(self._close_when_drained(replica),
                                      name=f"drain:{replica.model}:{replica.index}")
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    async def _close_when_drained(self, replica: Replica) -> None:
        await replica.runtime.drained()
        await replica.runtime.stop()
        current = self.replicas[replica.model]
        if current.get(replica.index) is replica:
            del current[replica.index]
        log.info("replica %d of %s closed", replica.index, replica.model)
        self._changed()

    def _changed(self) -> None:
        self.version += 1
        if self._on_change is not None:
            self._on_change()

    async def stop(self) -> None:
        """Stop every replica now (their pacers abort what is left)."""
        for task in list(self._drains):
            task.cancel()
        await asyncio.gather(*self._drains, return_exceptions=True)
        for replica in list(self):
            await replica.runtime.stop()
