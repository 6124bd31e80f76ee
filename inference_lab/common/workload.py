"""Synthetic workloads in inference-lab's format, for the offline driver (`sim`).

Knows: the `[workload]` table (or the same keys at the top level of the file):

    arrival_pattern = "poisson" | "uniform" | "batched" | "closed_loop"
    arrival_rate = 20.0          # req/s; poisson (exponential gaps) and uniform (1/rate gaps)
    num_concurrent_users = 24    # closed_loop: each user sends again when its reply ends
    batch_size = 64              # batched: requests per burst (default: all of them at t=0)
    batch_interval = 1.0         # batched: seconds between bursts (default 1.0)
    num_requests = 1000          # total requests, >= 1
    seed = 0                     # default 0
    input_len_dist = { type = "fixed", value = 16 }       # prompt tokens
    output_len_dist = { type = "lognormal", mean = 5.3, std_dev = 0.5 }  # output tokens

    shared_prefix_len = 2000     # every conversation starts with one of ... (default 0)
    num_shared_prefixes = 1      # ... this many fixed prefixes (default 1)
    num_turns = 4                # multi-turn: each turn resends the history (default 1)
    lora_adapters = { sql = 0.3, chat = 0.2 }  # a fraction of requests per adapter
    max_loras = 1                # the simulated engine's --max-loras (default 1)
    lora_rank = 16               # the adapters' rank (default 16)

With shared_prefix_len or num_turns, prompts are token IDs built by
inference_lab.common.conversations (a prompt = prefix + history + a new message of
input_len_dist tokens), so the engine's prefix cache sees their structure; in a closed
loop each user holds one conversation at a time, in an open loop request i belongs to
conversation i // num_turns.

length types: fixed (value), uniform (min, max; inclusive), normal (mean, std_dev),
lognormal (mean, std_dev of the log). Samples are rounded and at least 1. Open-loop arrival
times come from `open_loop_arrivals`; closed loop is driven by the offline runner, which
samples lengths from the same distributions. Does not know about the engine or the clock.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from inference_lab.common.toml import REQUIRED, ConfigError, Table, read_toml

__all__ = ["ConfigError", "LengthDist", "WorkloadSpec", "load_workload", "parse_workload",
           "open_loop_arrivals", "draw_adapter"]

PATTERNS = ("poisson", "uniform", "batched", "closed_loop")
DIST_TYPES = ("fixed", "uniform", "normal", "lognormal")
DEFAULT_BATCH_INTERVAL = 1.0  # seconds between bursts of a batched workload

_DIST_KEYS = ("type", "value", "min", "max", "mean", "std_dev")
_KEYS = ("arrival_pattern", "arrival_rate", "num_concurrent_users", "batch_size",
         "batch_interval", "num_requests", "seed", "input_len_dist", "output_len_dist",
         "shared_prefix_len", "num_shared_prefixes", "num_turns", "lora_adapters",
         "max_loras", "lora_rank")
# The other sections of an inference-lab all-in-one file, ignored beside a [workload] table.
_OTHER_SECTIONS = ("hardware", "model", "scheduler", "simulation")


@dataclass(frozen=True, slots=True)
class LengthDist:
    """A token-count distribution; only the fields of its `type` matter."""

    type: str  # fixed | uniform | normal | lognormal
    value: int = 0  # fixed
    min: int = 0  # uniform, inclusive
    max: int = 0
    mean: float = 0.0  # normal; lognormal: of the log
    std_dev: float = 0.0

    def sample(self, rng: random.Random) -> int:
        """One length, rounded, at least 1. Draws nothing from `rng` when fixed."""
        if self.type == "fixed":
            x = self.value
        elif self.type == "uniform":
            x = rng.randint(self.min, self.max)
        elif self.type == "normal":
            x = rng.normalvariate(self.mean, self.std_dev)
        else:
            x = rng.lognormvariate(self.mean, self.std_dev)
        return max(1, round(x))


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    arrival_pattern: str
    num_requests: int
    input_len_dist: LengthDist
    output_len_dist: LengthDist
    arrival_rate: float | None = None  # poisson, uniform
    num_concurrent_users: int | None = None  # closed_loop
    batch_size: int | None = None  # batched; None = all num_requests at once
    batch_interval: float = DEFAULT_BATCH_INTERVAL  # batched
    seed: int = 0
    shared_prefix_len: int = 0  # tokens of the shared system prompt(s); 0 = none
    num_shared_prefixes: int = 1
    num_turns: int = 1  # turns per conversation
    lora_adapters: tuple[tuple[str, float], ...] = ()  # (adapter, fraction of requests)
    max_loras: int = 1
    lora_rank: int = 16

    @property
    def structured(self) -> bool:
        """Prompts are token IDs with shared prefixes or growing histories."""
        return self.shared_prefix_len > 0 or self.num_turns > 1


def _parse_dist(t: Table) -> LengthDist:
    kind = t.get("type", str, f"one of {', '.join(DIST_TYPES)}", ok=lambda v: v in DIST_TYPES)
    if kind == "fixed":
        dist = LengthDist(kind, value=t.get("value", int, "an integer >= 1", ok=lambda v: v >= 1))
    elif kind == "uniform":
        low = t.get("min", int, "an integer >= 1", ok=lambda v: v >= 1)
        high = t.get("max", int, f"an integer >= min ({low})", ok=lambda v: v >= low)
        dist = LengthDist(kind, min=low, max=high)
    else:
        mean = t.get("mean", float, "a number")
        if kind == "lognormal" and mean > 30:  # e^30 tokens: surely a mean length, not a log
            raise t.error("mean", "the mean of the log of the length (e.g. 5.5 for ~245 tokens)", mean)
        std_dev = t.get("std_dev", float, "a number >= 0", ok=lambda v: v >= 0)
        dist = LengthDist(kind, mean=mean, std_dev=std_dev)
    t.done()
    return dist


def _parse_adapters(t: Table) -> tuple[tuple[str, float], ...]:
    """`lora_adapters = { name = fraction, ... }`: fractions in (0, 1] summing to <= 1."""
    what = "a table of adapter name = fraction of requests (> 0, summing to at most 1)"
    table = t.get("lora_adapters", dict, what, {})
    pairs = tuple(table.items())
    if any(isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1
           for _, f in pairs) or sum(f for _, f in pairs) > 1 + 1e-9:
        raise t.error("lora_adapters", what, table)
    return tuple((name, float(f)) for name, f in pairs)


def parse_workload(doc: dict, where: str) -> WorkloadSpec:
    """A WorkloadSpec from a parsed file: its [workload] table, else its top level."""
    if "workload" in doc:
        Table(doc, where, keys=("workload", *_OTHER_SECTIONS))
        t = Table(doc["workload"], where, "workload", _KEYS)
    else:
        t = Table(doc, where, "", _KEYS)
    pattern = t.get("arrival_pattern", str, f"one of {', '.join(PATTERNS)}", ok=lambda v: v in PATTERNS)
    needs_rate = pattern in ("poisson", "uniform")
    rate = t.get("arrival_rate", float, "a number > 0 (requests per second)",
                 REQUIRED if needs_rate else None, ok=lambda v: v > 0)
    users = t.get("num_concurrent_users", int, "an integer >= 1",
                  REQUIRED if pattern == "closed_loop" else None, ok=lambda v: v >= 1)
    spec = WorkloadSpec(
        arrival_pattern=pattern,
        arrival_rate=rate,
        num_concurrent_users=users,
        batch_size=t.get("batch_size", int, "an integer >= 1", None, ok=lambda v: v >= 1),
        batch_interval=t.get("batch_interval", float, "a number >= 0 (seconds)",
                             DEFAULT_BATCH_INTERVAL, ok=lambda v: v >= 0),
        num_requests=t.get("num_requests", int, "an integer >= 1", ok=lambda v: v >= 1),
        seed=t.get("seed", int, "an integer >= 0", 0, ok=lambda v: v >= 0),
        input_len_dist=_parse_dist(t.table("input_len_dist", keys=_DIST_KEYS)),
        output_len_dist=_parse_dist(t.table("output_len_dist", keys=_DIST_KEYS)),
        shared_prefix_len=t.get("shared_prefix_len", int, "an integer >= 0 (tokens)", 0,
                                ok=lambda v: v >= 0),
        num_shared_prefixes=t.get("num_shared_prefixes", int, "an integer >= 1", 1,
                                  ok=lambda v: v >= 1),
        num_turns=t.get("num_turns", int, "an integer >= 1", 1, ok=lambda v: v >= 1),
        lora_adapters=_parse_adapters(t),
        max_loras=t.get("max_loras", int, "an integer >= 1", 1, ok=lambda v: v >= 1),
        lora_rank=t.get("lora_rank", int, "an integer >= 1", 16, ok=lambda v: v >= 1),
    )
    t.done()
    return spec


def load_workload(path: str | Path) -> WorkloadSpec:
    """The workload of a TOML file; a bad one is a ConfigError naming the file and key."""
    return parse_workload(read_toml(path), str(path))


def output_length_sampler(path: str | Path, seed: int = 0) -> Callable[[], int]:
    """Seeded draws from the workload's output-length distribution (what `engine
    --workload` gives engine.sim.lengths.OutputLength)."""
    dist = load_workload(path).output_len_dist
    rng = random.Random(seed)
    return lambda: int(dist.sample(rng))


def open_loop_arrivals(spec: WorkloadSpec,
                       rng: random.Random | None = None) -> Iterator[tuple[float, int, int]]:
    """(arrival time in s, prompt tokens, output tokens) for each of `num_requests` requests
    of a poisson, uniform or batched workload, in arrival order. Per request the gap is drawn
    first (poisson only), then the prompt length, then the output length.
    poisson: exponential gaps of mean 1/rate, the first after one gap; uniform: a request
    every 1/rate s, the first at 1/rate; batched: `batch_size` requests at t = 0,
    `batch_interval`, 2 * `batch_interval`, ... `rng` defaults to Random(spec.seed)."""
    if spec.arrival_pattern == "closed_loop":
        raise ValueError("closed_loop arrivals depend on completions: the runner drives them")
    rng = rng if rng is not None else random.Random(spec.seed)
    t = 0.0
    for i in range(spec.num_requests):
        if spec.arrival_pattern == "poisson":
            t += rng.expovariate(spec.arrival_rate)
        elif spec.arrival_pattern == "uniform":
            t = (i + 1) / spec.arrival_rate
        else:
            t = (i // (spec.batch_size or spec.num_requests)) * spec.batch_interval
        yield t, spec.input_len_dist.sample(rng), spec.output_len_dist.sample(rng)


def draw_adapter(adapters, rng: random.Random):
    """From (adapter, fraction) pairs, an adapter with its fraction's probability, else
    None (the base model): one uniform draw from `rng` per request."""
    x = rng.random()
    for adapter, fraction in adapters:
        if x < fraction:
            return adapter
        x -= fraction
    return None
