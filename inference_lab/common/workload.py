"""Synthetic workloads in inference-lab's format, for the offline driver (`sim`).

Knows: the `[workload]` table (or the same keys at the top level of the file):

    arrival_pattern = "poisson" | "uniform" (= "fixed_rate") | "burst" | "batched" | "closed_loop"
                                 # | "trace"
    arrival_rate = 20.0          # req/s; poisson (exponential gaps) and uniform (1/rate gaps);
                                 # default 1.0, as inference-lab's
    rate_schedule = { type = "sine", min = 2, max = 20, period_secs = 60 }  # lambda(t) instead
                                 # of arrival_rate; or { type = "square", low, high,
                                 # period_secs, duty } or { type = "trace", points = [[t, rate], ...] }
    num_concurrent_users = 24    # closed_loop: each user sends again when its reply ends
    closed_loop_jitter_secs = 0.05  # closed_loop: first arrivals spread uniformly over [0, this)
    batch_size = 64              # batched: requests per burst (default: all of them at t=0)
    batch_interval = 1.0         # batched: seconds between bursts (default 1.0)
    num_requests = 1000          # total requests, >= 1 (may be absent with duration_secs
                                 # or dataset_path: then those bound the run)
    duration_secs = 600.0        # no arrival after this simulated time; admitted ones finish
    dataset_path = "prompts.jsonl"  # prompts from an OpenAI batch file (see common.dataset)
    seed = 0                     # default 0
    input_len_dist = { type = "fixed", value = 16 }       # prompt tokens
    output_len_dist = { type = "lognormal", mean = 5.3, std_dev = 0.5 }  # output tokens

    shared_prefix_len = 2000     # every conversation starts with one of ... (default 0)
    num_shared_prefixes = 1      # ... this many fixed prefixes (default 1)
    num_turns = 4                # multi-turn: each turn resends the history (default 1)
    lora_adapters = { sql = 0.3, chat = 0.2 }  # a fraction of requests per adapter
    max_loras = 1                # the simulated engine's --max-loras (default 1)
    lora_rank = 16               # the adapters' rank (default 16)
    pooling = true               # an embedding workload: every request is a pooling
                                 # request (its prefill, nothing generated); no
                                 # output_len_dist (default false)

    trace_path = "day.jsonl"     # trace: a production trace replayed request by request
    trace_format = "mooncake"    # ... "mooncake" | "azure" | "burstgpt" (common.traces)
    trace_speed = 1.0            # ... times divided by this (default 1)
    trace_window = [3600, 7200]  # ... only [start, end) seconds of the trace, from its start

With shared_prefix_len or num_turns, prompts are token IDs built by
inference_lab.common.conversations (a prompt = prefix + history + a new message of
input_len_dist tokens), so the engine's prefix cache sees their structure; in a closed
loop each user holds one conversation at a time, in an open loop request i belongs to
conversation i // num_turns.

length types: fixed (value), uniform (min, max; inclusive), normal (mean, std_dev),
lognormal (mean, std_dev of the log). Samples are rounded and at least 1. Open-loop arrival
times come from `open_loop_arrivals`; closed loop is driven by the offline runner, which
draws requests with `draw_request` from the same distributions. burst (inference-lab's):
gaps of 1-10 ms a fifth of the time, else 0.5-2 s, whatever the rate. With dataset_path
the prompts are the file's, in order, the output length min(a draw of output_len_dist, the
entry's max_tokens), and the run ends with the file. inference-lab's session replay keys
(sessions_path, num_sessions, stationary_start_sessions, resample_sessions) are refused by
name: sessions are not simulated here. `trace` replays a trace file (common.traces): each
request at its time with its lengths (num_requests and duration_secs may cut it short),
a Mooncake trace's prompts built from its hash ids so that the prefix cache sees its
sharing; the length distributions and the rate keys do not apply to it. Does not know
about the engine or the clock.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from inference_lab.common.dataset import Dataset, DatasetError
from inference_lab.common.traces import FORMATS as TRACE_FORMATS
from inference_lab.common.traces import Trace, TraceError, cached_trace
from inference_lab.common.toml import REQUIRED, ConfigError, Table, read_toml

__all__ = ["ConfigError", "LengthDist", "RateSchedule", "WorkloadSpec", "load_workload",
           "parse_workload", "open_loop_arrivals", "draw_request", "draw_adapter",
           "resolve_trace", "trace_arrivals"]

PATTERNS = ("poisson", "uniform", "fixed_rate", "burst", "batched", "closed_loop", "trace")
DIST_TYPES = ("fixed", "uniform", "normal", "lognormal")
SCHEDULE_TYPES = ("sine", "square", "trace")
DEFAULT_BATCH_INTERVAL = 1.0  # seconds between bursts of a batched workload
DEFAULT_ARRIVAL_RATE = 1.0  # requests/s when absent, as inference-lab's
DEFAULT_DATASET_MAX_OUTPUT = 16384  # an entry without max_tokens, as inference-lab's

_DIST_KEYS = ("type", "value", "min", "max", "mean", "std_dev")
_SCHEDULE_KEYS = ("type", "min", "max", "period_secs", "low", "high", "duty", "points")
_SESSION_KEYS = ("sessions_path", "num_sessions", "stationary_start_sessions",
                 "resample_sessions")
_KEYS = ("arrival_pattern", "arrival_rate", "rate_schedule", "num_concurrent_users",
         "closed_loop_jitter_secs", "batch_size", "batch_interval", "num_requests",
         "duration_secs", "dataset_path", "seed", "input_len_dist", "output_len_dist",
         "shared_prefix_len", "num_shared_prefixes", "num_turns", "lora_adapters",
         "max_loras", "lora_rank", "pooling", "trace_path", "trace_format", "trace_speed", "trace_window",
         *_SESSION_KEYS)
_TRACE_KEYS = ("trace_path", "trace_format", "trace_speed", "trace_window")
# What a trace gives each request itself, or what does not apply to one.
_NOT_WITH_TRACE = ("arrival_rate", "rate_schedule", "num_concurrent_users", "closed_loop_jitter_secs",
                   "batch_size", "batch_interval", "dataset_path", "input_len_dist",
                   "output_len_dist", "shared_prefix_len", "num_shared_prefixes", "num_turns")
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


TRACE_LENGTHS = LengthDist("fixed", value=1)  # what a trace workload carries, unused


@dataclass(frozen=True, slots=True)
class RateSchedule:
    """A time-varying arrival rate lambda(t) >= 0, requests/s (inference-lab's
    `rate_schedule`): sine from `min` (t = 0) to `max` (half a period); square at `high`
    for the first `duty` of each period, else `low`; trace linear between (t, rate) points,
    flat outside them."""

    type: str  # sine | square | trace
    low: float = 0.0  # sine: min; square: low
    high: float = 0.0  # sine: max; square: high
    period_secs: float = 1.0
    duty: float = 0.5
    points: tuple[tuple[float, float], ...] = ()

    def rate_at(self, t: float) -> float:
        if self.type == "sine":
            phase = 2 * math.pi * t / max(self.period_secs, 1e-9)
            rate = self.low + (self.high - self.low) * 0.5 * (1 - math.cos(phase))
        elif self.type == "square":
            rate = self.high if (t / max(self.period_secs, 1e-9)) % 1.0 < self.duty else self.low
        else:
            pts = self.points
            if t <= pts[0][0]:
                rate = pts[0][1]
            elif t >= pts[-1][0]:
                rate = pts[-1][1]
            else:
                rate = pts[-1][1]
                for (t0, r0), (t1, r1) in zip(pts, pts[1:]):
                    if t0 <= t <= t1:
                        rate = r0 + (t - t0) / max(t1 - t0, 1e-9) * (r1 - r0)
                        break
        return max(rate, 0.0)


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    arrival_pattern: str  # poisson | uniform | burst | batched | closed_loop
    num_requests: int | None  # None: bounded by duration_secs or the dataset
    input_len_dist: LengthDist
    output_len_dist: LengthDist
    arrival_rate: float | None = None  # poisson, uniform
    rate_schedule: RateSchedule | None = None  # poisson, uniform: lambda(t) over arrival_rate
    num_concurrent_users: int | None = None  # closed_loop
    closed_loop_jitter_secs: float = 0.0  # closed_loop: first arrivals over [0, this)
    duration_secs: float | None = None  # no arrival after this simulated time
    dataset_path: str | None = None  # prompts from this OpenAI batch JSONL file
    batch_size: int | None = None  # batched; None = all num_requests at once
    batch_interval: float = DEFAULT_BATCH_INTERVAL  # batched
    seed: int = 0
    shared_prefix_len: int = 0  # tokens of the shared system prompt(s); 0 = none
    num_shared_prefixes: int = 1
    num_turns: int = 1  # turns per conversation
    lora_adapters: tuple[tuple[str, float], ...] = ()  # (adapter, fraction of requests)
    max_loras: int = 1
    lora_rank: int = 16
    pooling: bool = False  # every request a pooling request: output length 0
    trace_path: str | None = None  # trace: the file
    trace_format: str = ""  # trace: mooncake | azure | burstgpt
    trace_speed: float = 1.0  # trace: times divided by this
    trace_window: tuple[float, float] | None = None  # trace: [start, end) s of the trace

    def trace(self) -> Trace:
        """The trace of a `trace` workload (read once while the file is unchanged)."""
        return cached_trace(self.trace_path, self.trace_format, speed=self.trace_speed,
                            window=self.trace_window)

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


# An adapter's name is also a directory's (an experiment writes DIR/adapters/<name>):
# letters, digits, `.`, `_` and `-`, starting with a letter or a digit, up to 128.
ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _parse_adapters(t: Table) -> tuple[tuple[str, float], ...]:
    """`lora_adapters = { name = fraction, ... }`: fractions in (0, 1] summing to <= 1,
    names that are safe as file names (ADAPTER_NAME)."""
    what = "a table of adapter name = fraction of requests (> 0, summing to at most 1)"
    table = t.get("lora_adapters", dict, what, {})
    for name in table:
        if not ADAPTER_NAME.fullmatch(name):
            raise t.error("lora_adapters", "adapter names of letters, digits, `.`, `_` and "
                          "`-`, starting with a letter or a digit (at most 128)", name)
    pairs = tuple(table.items())
    if any(isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1
           for _, f in pairs) or sum(f for _, f in pairs) > 1 + 1e-9:
        raise t.error("lora_adapters", what, table)
    return tuple((name, float(f)) for name, f in pairs)


def _parse_schedule(t: Table) -> RateSchedule:
    kind = t.get("type", str, f"one of {', '.join(SCHEDULE_TYPES)}",
                  ok=lambda v: v in SCHEDULE_TYPES)
    rate, period = "a number >= 0 (requests per second)", "a number > 0 (seconds)"
    if kind == "sine":
        low = t.get("min", float, rate, ok=lambda v: v >= 0)
        sched = RateSchedule(kind, low=low, high=t.get("max", float, f"a number >= min ({low})",
                                                       ok=lambda v: v >= low),
                             period_secs=t.get("period_secs", float, period, ok=lambda v: v > 0))
    elif kind == "square":
        sched = RateSchedule(kind, low=t.get("low", float, rate, ok=lambda v: v >= 0),
                             high=t.get("high", float, rate, ok=lambda v: v >= 0),
                             period_secs=t.get("period_secs", float, period, ok=lambda v: v > 0),
                             duty=t.get("duty", float, "a fraction in [0, 1]",
                                        ok=lambda v: 0 <= v <= 1))
    else:
        what = "one or more [time_secs, rate] pairs, times increasing, rates >= 0"
        points = t.get("points", list, what)
        ok = bool(points) and all(
            isinstance(p, list) and len(p) == 2 and all(
                not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x)
                for x in p) and p[1] >= 0 for p in points)
        if not ok or any(a[0] > b[0] for a, b in zip(points, points[1:])):
            raise t.error("points", what, points)
        sched = RateSchedule(kind, points=tuple((float(a), float(b)) for a, b in points))
    t.done()
    return sched


def parse_workload(doc: dict, where: str) -> WorkloadSpec:
    """A WorkloadSpec from a parsed file: its [workload] table, else its top level."""
    if "workload" in doc:
        Table(doc, where, keys=("workload", *_OTHER_SECTIONS))
        t = Table(doc["workload"], where, "workload", _KEYS)
    else:
        t = Table(doc, where, "", _KEYS)
    for key in _SESSION_KEYS:
        if key in t.data:
            raise ConfigError(where, t.key(key), "session replay is not simulated by this lab "
                              "(inference-lab's sessions mode); use num_turns and "
                              "shared_prefix_len for conversations, or dataset_path for prompts")
    pattern = t.get("arrival_pattern", str, f"one of {', '.join(PATTERNS)}", ok=lambda v: v in PATTERNS)
    pattern = "uniform" if pattern == "fixed_rate" else pattern  # inference-lab's alias
    if pattern == "trace":
        return _parse_trace_workload(t)
    for key in _TRACE_KEYS:
        if key in t.data:
            raise ConfigError(where, t.key(key), 'only with arrival_pattern = "trace"')
    needs_rate = pattern in ("poisson", "uniform")
    rate = t.get("arrival_rate", float, "a number > 0 (requests per second)",
                 DEFAULT_ARRIVAL_RATE if needs_rate else None, ok=lambda v: v > 0)
    schedule = (_parse_schedule(t.table("rate_schedule", keys=_SCHEDULE_KEYS))
                if "rate_schedule" in t.data else t.table("rate_schedule", None))
    users = t.get("num_concurrent_users", int, "an integer >= 1",
                  REQUIRED if pattern == "closed_loop" else None, ok=lambda v: v >= 1)
    duration = t.get("duration_secs", float, "a number > 0 (simulated seconds)", None,
                     ok=lambda v: v > 0)
    dataset = t.get("dataset_path", str, "a path to a JSONL file of OpenAI batch requests",
                    None, ok=bool)
    # batched arrivals all come at once: only a count or the dataset's end bounds them
    bounded = dataset is not None or (duration is not None and pattern != "batched")
    if not bounded and "num_requests" not in t.data:
        raise ConfigError(where, t.key("num_requests"), "missing; expected an integer >= 1 "
                          "(or duration_secs or dataset_path to end the run)")
    pooling = t.get("pooling", bool, "true or false", False)
    if pooling and "output_len_dist" in t.data:
        raise ConfigError(where, t.key("output_len_dist"), "a pooling workload generates "
                          "nothing: leave output_len_dist out")
    spec = WorkloadSpec(
        arrival_pattern=pattern,
        arrival_rate=rate,
        rate_schedule=schedule if needs_rate else None,
        num_concurrent_users=users,
        closed_loop_jitter_secs=t.get("closed_loop_jitter_secs", float, "a number >= 0 (seconds)",
                                      0.0, ok=lambda v: v >= 0),
        duration_secs=duration,
        dataset_path=dataset,
        batch_size=t.get("batch_size", int, "an integer >= 1", None, ok=lambda v: v >= 1),
        batch_interval=t.get("batch_interval", float, "a number >= 0 (seconds)",
                             DEFAULT_BATCH_INTERVAL, ok=lambda v: v >= 0),
        num_requests=t.get("num_requests", int, "an integer >= 1", None, ok=lambda v: v >= 1),
        seed=t.get("seed", int, "an integer >= 0", 0, ok=lambda v: v >= 0),
        input_len_dist=_parse_dist(t.table("input_len_dist", keys=_DIST_KEYS)),
        output_len_dist=(LengthDist("fixed", value=1) if pooling else
                         _parse_dist(t.table("output_len_dist", keys=_DIST_KEYS))),
        shared_prefix_len=t.get("shared_prefix_len", int, "an integer >= 0 (tokens)", 0,
                                ok=lambda v: v >= 0),
        num_shared_prefixes=t.get("num_shared_prefixes", int, "an integer >= 1", 1,
                                  ok=lambda v: v >= 1),
        num_turns=t.get("num_turns", int, "an integer >= 1", 1, ok=lambda v: v >= 1),
        lora_adapters=_parse_adapters(t),
        max_loras=t.get("max_loras", int, "an integer >= 1", 1, ok=lambda v: v >= 1),
        lora_rank=t.get("lora_rank", int, "an integer >= 1", 16, ok=lambda v: v >= 1),
        pooling=pooling,
    )
    t.done()
    if pooling and spec.num_turns > 1:
        raise ConfigError(where, t.key("num_turns"), "a pooling workload has no replies to "
                          "carry into a next turn: expected 1")
    return spec


def _parse_trace_workload(t: Table) -> WorkloadSpec:
    for key in _NOT_WITH_TRACE:
        if key in t.data:
            raise ConfigError(t.where, t.key(key), "does not apply to a trace: the trace gives "
                              "each request its time and lengths")
    window = None
    if "trace_window" in t.data:
        what = "[start, end]: seconds of the trace, 0 <= start < end"
        raw = t.get("trace_window", list, what)
        if not (len(raw) == 2 and all(not isinstance(x, bool) and isinstance(x, (int, float))
                                      and math.isfinite(x) for x in raw)
                and 0 <= raw[0] < raw[1]):
            raise t.error("trace_window", what, raw)
        window = (float(raw[0]), float(raw[1]))
    spec = WorkloadSpec(
        arrival_pattern="trace",
        num_requests=t.get("num_requests", int, "an integer >= 1", None, ok=lambda v: v >= 1),
        input_len_dist=TRACE_LENGTHS, output_len_dist=TRACE_LENGTHS,
        duration_secs=t.get("duration_secs", float, "a number > 0 (simulated seconds)", None,
                            ok=lambda v: v > 0),
        seed=t.get("seed", int, "an integer >= 0", 0, ok=lambda v: v >= 0),
        lora_adapters=_parse_adapters(t),
        max_loras=t.get("max_loras", int, "an integer >= 1", 1, ok=lambda v: v >= 1),
        lora_rank=t.get("lora_rank", int, "an integer >= 1", 16, ok=lambda v: v >= 1),
        trace_path=t.get("trace_path", str, "a path to a trace file", ok=bool),
        trace_format=t.get("trace_format", str, f"one of {', '.join(TRACE_FORMATS)}",
                           ok=lambda v: v in TRACE_FORMATS),
        trace_speed=t.get("trace_speed", float, "a number > 0 (times are divided by it)", 1.0,
                          ok=lambda v: v > 0),
        trace_window=window,
    )
    t.done()
    return spec


def resolve_trace(spec: WorkloadSpec, beside: Path, where: str, key: str = "trace_path") -> WorkloadSpec:
    """A trace workload with its trace_path found (from the working directory, else from
    `beside`) and the trace read whole, so a bad row is refused before anything runs
    (a ConfigError naming `key` and the row's line)."""
    if spec.trace_path is None:
        return spec
    found = Path(spec.trace_path)
    if not found.is_absolute() and not found.exists():
        other = beside / found
        found = other if other.exists() else found
    spec = replace(spec, trace_path=str(found))
    try:
        if not len(spec.trace()):
            raise TraceError(f"{found}: no request to replay"
                             + (" in the window" if spec.trace_window else ""))
    except TraceError as exc:
        raise ConfigError(where, key, str(exc)) from None
    return spec


def load_workload(path: str | Path) -> WorkloadSpec:
    """The workload of a TOML file; a bad one is a ConfigError naming the file and key.
    A relative dataset_path is found from the working directory (as inference-lab's),
    else from the workload file's directory; a missing or bad file is refused here."""
    spec = parse_workload(read_toml(path), str(path))
    if spec.dataset_path is not None:
        found = Path(spec.dataset_path)
        if not found.is_absolute() and not found.exists():
            beside = Path(path).parent / found
            found = beside if beside.exists() else found
        try:
            Dataset(found).check()
        except DatasetError as exc:
            raise ConfigError(str(path), "dataset_path", str(exc)) from None
        spec = replace(spec, dataset_path=str(found))
    return resolve_trace(spec, Path(path).parent, str(path))


def output_length_sampler(path: str | Path, seed: int = 0) -> Callable[[], int]:
    """Seeded draws from the workload's output-length distribution (what `engine
    --workload` gives engine.sim.lengths.OutputLength)."""
    dist = load_workload(path).output_len_dist
    rng = random.Random(seed)
    return lambda: int(dist.sample(rng))


def draw_request(spec: WorkloadSpec, rng: random.Random,
                 dataset: Iterator[tuple[bytes, int | None]] | None = None
                 ) -> tuple[int, int, bytes] | None:
    """(prompt tokens, output tokens, prompt token IDs or b"") of the next request: lengths
    drawn from the distributions (prompt first), or with `dataset` (from
    `Dataset(spec.dataset_path).prompts()`) its next prompt and an output length capped
    by the entry's max_tokens; None once the dataset has ended."""
    if dataset is None:
        prompt = spec.input_len_dist.sample(rng)
        return prompt, 0 if spec.pooling else spec.output_len_dist.sample(rng), b""
    entry = next(dataset, None)
    if entry is None:
        return None
    ids, cap = entry
    out = 0 if spec.pooling else min(spec.output_len_dist.sample(rng), cap or DEFAULT_DATASET_MAX_OUTPUT)
    return len(ids) // 4, out, ids


def open_loop_arrivals(spec: WorkloadSpec, rng: random.Random | None = None,
                       dataset: Iterator[tuple[bytes, int | None]] | None = None
                       ) -> Iterator[tuple[float, int, int, bytes]]:
    """(arrival time in s, prompt tokens, output tokens, prompt token IDs or b"") for each
    request of a poisson, uniform, burst or batched workload, in arrival order, until
    `num_requests`, `duration_secs` or the dataset ends. Per request the gap is drawn first
    (poisson, burst), then the request (`draw_request`).
    poisson: exponential gaps of mean 1/rate, the first after one gap; uniform: a request
    every 1/rate s, the first at 1/rate; with a rate_schedule the rate is lambda at the
    previous arrival; burst: 1-10 ms gaps a fifth of the time, else 0.5-2 s; batched:
    `batch_size` requests at t = 0, `batch_interval`, 2 * `batch_interval`, ...
    `rng` defaults to Random(spec.seed)."""
    if spec.arrival_pattern == "closed_loop":
        raise ValueError("closed_loop arrivals depend on completions: the runner drives them")
    if spec.arrival_pattern == "trace":
        yield from trace_arrivals(spec)
        return
    rng = rng if rng is not None else random.Random(spec.seed)
    t = 0.0
    sched = spec.rate_schedule
    i = 0
    while spec.num_requests is None or i < spec.num_requests:
        pattern = spec.arrival_pattern
        rate = max(sched.rate_at(t), 1e-9) if sched is not None else spec.arrival_rate
        if pattern == "poisson":
            t += rng.expovariate(rate)
        elif pattern == "uniform":
            t = t + 1 / rate if sched is not None else (i + 1) / rate
        elif pattern == "burst":
            t += rng.uniform(0.001, 0.01) if rng.random() < 0.2 else rng.uniform(0.5, 2.0)
        elif spec.batch_size is None:
            t = 0.0
        else:
            t = (i // spec.batch_size) * spec.batch_interval
        if spec.duration_secs is not None and t > spec.duration_secs:
            return
        request = draw_request(spec, rng, dataset)
        if request is None:
            return
        yield t, *request
        i += 1


def draw_adapter(adapters, rng: random.Random):
    """From (adapter, fraction) pairs, an adapter with its fraction's probability, else
    None (the base model): one uniform draw from `rng` per request."""
    x = rng.random()
    for adapter, fraction in adapters:
        if x < fraction:
            return adapter
        x -= fraction
    return None


def trace_arrivals(spec: WorkloadSpec) -> Iterator[tuple[float, int, int, bytes]]:
    """A trace workload's requests as open_loop_arrivals gives them: (time, prompt tokens,
    output tokens, prompt token IDs: a Mooncake trace's blocks, else b""), in time order,
    until num_requests or duration_secs."""
    trace = spec.trace()
    n = len(trace) if spec.num_requests is None else min(len(trace), spec.num_requests)
    end = math.inf if spec.duration_secs is None else spec.duration_secs
    times, inputs, outputs = trace.times, trace.inputs, trace.outputs
    blocks = trace.has_blocks
    for i in range(n):
        if times[i] > end:
            return
        yield times[i], inputs[i], outputs[i], trace.prompt_ids(i, spec.seed) if blocks else b""
