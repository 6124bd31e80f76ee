"""The fleet's rules over replica state, told the time: one home for the wall-clock fleet
(engine.fleet.replicas) and the virtual-time lab (experiments.virtual).

Knows: which replicas each model has (an index per replica; its gateway port is the base
port + index), when each is ready (created + its start-up delay, read against the clock
it is given: no timer), draining (admits nothing, holds its index until it has closed),
how a scale request is checked (0 .. max_replicas active, no index past the limit while
some still drain) and applied (the lowest free indices are added, the highest active
ones drained), which replica a request may go to (`lookup`: not found, or unavailable
with a machine-readable reason), and what a replica's row of /control/replicas says
(`status`). Several engine processes may share one fleet's indices: a process holds
those of its `Shard` (index mod P = p), and a count asked of it is the fleet's.

Does not know: what a replica runs on (`Replica.runtime` is the caller's), nor how a
runtime is started, drained or stopped (the caller orders that), nor event loops, RPC or
HTTP.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

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
    ready_at: float  # clock time at which its start-up delay has passed
    draining: bool = False

    def ready(self, now: float) -> bool:
        return not self.draining and now >= self.ready_at

    def ready_in(self, now: float) -> float:
        return 0.0 if self.draining else max(self.ready_at - now, 0.0)


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    """A replica's row of /control/replicas (its port and load are the caller's)."""

    model: str
    replica: int
    starting: bool
    draining: bool
    ready_in_s: float

    @property
    def ready(self) -> bool:
        return not (self.starting or self.draining)


def status(replica: Replica, now: float) -> ReplicaStatus:
    ready_in = replica.ready_in(now)
    return ReplicaStatus(replica.model, replica.index, ready_in > 0, replica.draining, ready_in)


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


@dataclass(frozen=True, slots=True)
class ScaleStep:
    """What a scale request does to one model: the indices to add, the replicas to drain
    (highest index first)."""

    model: str
    add: list[int]
    drain: list[Replica]


class ReplicaTable:
    """Every replica of every model, by model then index, with the fleet's rules; the
    clock is the caller's (`clock()`: the time `ready_at` is read against)."""

    def __init__(self, models: list[str], clock: Callable[[], float],
                 max_replicas: int = MAX_REPLICAS, shard: Shard = Shard()) -> None:
        self.clock = clock
        self.max_replicas = max_replicas
        self.shard = shard
        self.replicas: dict[str, dict[int, Replica]] = {name: {} for name in models}

    # ---- reading ---------------------------------------------------------------------
    def now(self) -> float:
        return self.clock()

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

    def statuses(self, model: str = "") -> list[ReplicaStatus]:
        """The rows of /control/replicas of `model` (every model when empty)."""
        now = self.now()
        return [status(r, now) for r in self.select(model, None)]

    # ---- scaling ---------------------------------------------------------------------
    def new_indices(self, name: str, count: int) -> list[int]:
        """The indices `count` new replicas of `name` take: the lowest free ones of this
        shard (a draining replica keeps its index, and its port, until it has closed)."""
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
            new = self.new_indices(name, max(own - active, 0))
            if new and new[-1] >= self.max_replicas:
                raise ValueError(
                    f"{name} holds {len(current)} replicas ({len(current) - active} draining): "
                    f"{replicas} active would need replica index {new[-1]}, and at most "
                    f"{self.max_replicas} replicas may be held at once (indices 0 to "
                    f"{self.max_replicas - 1}); retry once the draining ones have closed")

    def plan(self, model: str, replicas: int) -> list[ScaleStep]:
        """What giving `model` (every model when empty; KeyError for an unknown one)
        `replicas` active replicas (this shard's share of them) does, model by model;
        ValueError (check_count) before any change is planned."""
        names = [model] if model else list(self.replicas)
        for name in names:
            self.replicas[name]  # KeyError before anything else
        self.check_count(replicas, model)
        own = self.shard.share(replicas)
        steps = []
        for name in names:
            current = self.replicas[name]
            active = sorted(i for i, r in current.items() if not r.draining)
            add = self.new_indices(name, own - len(active)) if len(active) < own else []
            steps.append(ScaleStep(name, add, [current[i] for i in reversed(active[own:])]))
        return steps

    def place(self, name: str, index: int, runtime: Any, delay: float) -> Replica:
        """A new replica of `name` at `index`, ready `delay` seconds from now."""
        replica = self.replicas[name][index] = Replica(name, index, runtime, self.now() + delay)
        return replica

    def forget(self, replica: Replica) -> bool:
        """A closed replica leaves the table (unless another took its index since);
        whether it did."""
        current = self.replicas[replica.model]
        if current.get(replica.index) is replica:
            del current[replica.index]
            return True
        return False
