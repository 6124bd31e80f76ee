"""The replica set of one engine process: N independent replicas of every served model.

Knows: the fleet's rules (engine.fleet.rules: indices, readiness, how a scale request is
checked and applied, which replica admits a request) on the loop's clock, read when
asked (no timer, no CPU while idle), and the lifecycle of each replica's runtime: a new
one is started, a drained one stops admitting at once, finishes what it holds, then is
closed and forgotten. `scale(model, 0)` drains every replica of a model: it then answers
"unavailable" until one is ready again.

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
from collections.abc import Callable
from typing import Any

from inference_lab.engine.fleet.rules import (MAX_REPLICAS, Replica, ReplicaNotFound,
                                              ReplicaTable, ReplicaUnavailable, Shard)
from inference_lab.engine.sim.specs import Deployment

__all__ = ["Fleet", "Replica", "ReplicaNotFound", "ReplicaUnavailable", "Shard", "MAX_REPLICAS"]

log = logging.getLogger(__name__)


class Fleet(ReplicaTable):
    """Every replica of every model, by model then index: the rules of engine.fleet.rules
    on the loop's clock, and the lifecycle of each replica's runtime."""

    def __init__(self, deployments: list[Deployment], make_runtime: Callable[[Deployment, int], Any],
                 startup_delay: Callable[[Deployment], float],
                 on_change: Callable[[], None] | None = None,
                 max_replicas: int = MAX_REPLICAS, shard: Shard = Shard()) -> None:
        self._loop = asyncio.get_running_loop()
        super().__init__([d.name for d in deployments], self._loop.time, max_replicas, shard)
        self.deployments = {d.name: d for d in deployments}
        self._make = make_runtime
        self._delay = startup_delay
        self._on_change = on_change  # the set of replicas changed (sessions, listeners)
        self.version = 0  # counts changes of the replica set
        self._drains: set[asyncio.Task] = set()

    # ---- changing ---------------------------------------------------------------------
    def scale(self, model: str, replicas: int) -> list[Replica]:
        """Give `model` (every model when empty; KeyError for an unknown one) `replicas`
        active replicas (this shard's share of them); returns the selected models'
        replicas afterwards."""
        for step in self.plan(model, replicas):
            self._add(step.model, step.add)
            for replica in step.drain:
                self._drain(replica)
        self._changed()
        return self.select(model, None)

    def _add(self, name: str, indices: list[int]) -> None:
        deployment = self.deployments[name]
        delay = self._delay(deployment)
        for index in indices:
            runtime = self._make(deployment, index)
            runtime.start()
            self.place(name, index, runtime, delay)
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
            self.place(old.model, index, runtime, delay)
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
        self.forget(replica)
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
