"""What an autoscaler reads: the replicas' metrics as a Prometheus would hold them after
scraping each replica's /metrics at an interval, and a small subset of PromQL over them.

- `parse_exposition(text, model)`: the sample values of the series in SCRAPED (vLLM's
  queue gauges and request counters, the lab's capacity gauges, and SGLang's equivalents
  of those it serves, common.engine_series: a fleet of SGLang profiles is scaled on
  `sglang:num_queue_reqs` as a real one would be) whose model_name is `model`, each
  summed over its other labels (finished_reason, reason, dp_rank)
  (common.prometheus_text).
- `MetricStore`: samples by metric and series (a replica index, or "front": the counters
  of the load balancer in front, which the runner keeps), with Prometheus's staleness: a
  target that was not in the latest scrape round has no current value.
- `parse_query(text)`: a Query of the forms `NAME`, `NAME{label="v", ...}`, `AGG(...)`
  with AGG one of sum, avg, max, min, count, and `rate(NAME[5m])` / `irate(...)` inside.
  Labels: `model_name` and `engine` (the replica index). Anything else is a QueryError
  naming what is not supported. `rate` is the increase over the range divided by the
  time between its first and last samples (no extrapolation to the range's edges).
- `FleetView`: what one decision sees: the scale target's replicas, each pod's state, and
  the store as of the decision's instant less the pipeline's delay.

Knows nothing of HTTP or clocks: the caller stores scrapes and passes the time.
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass, field

from inference_lab.common.engine_series import SGLANG, renamed
from inference_lab.common.prometheus_text import model_sums

__all__ = ["SCRAPED", "FRONT", "FRONT_REQUESTS", "FRONT_UNROUTED", "MetricStore", "Pod",
           "FleetView", "Query", "QueryError", "parse_query", "parse_exposition"]

FRONT = "front"  # the series key of the load balancer's own counters
FRONT_REQUESTS = "inference_lab_front_requests_total"  # every request the load sent to the fleet
FRONT_UNROUTED = "inference_lab_front_unrouted_total"  # ... that found no ready replica (503)
_VLLM = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
         "vllm:request_success_total", "vllm:generation_tokens_total",
         "vllm:prompt_tokens_total", "inference_lab_rejections_total",
         "inference_lab_max_num_seqs", "inference_lab_max_waiting")
_VLLM_COUNTERS = ("vllm:request_success_total", "vllm:generation_tokens_total",
                  "vllm:prompt_tokens_total", "inference_lab_rejections_total")
SCRAPED = (*_VLLM, *(n for n in renamed(dict.fromkeys(_VLLM), SGLANG) if n not in _VLLM))
COUNTERS = (*_VLLM_COUNTERS, *(n for n in renamed(dict.fromkeys(_VLLM_COUNTERS), SGLANG)
                               if n not in _VLLM), FRONT_REQUESTS, FRONT_UNROUTED)
KNOWN = (*SCRAPED, FRONT_REQUESTS, FRONT_UNROUTED)
HISTORY_S = 3600.0  # samples kept per series (the longest range a query may ask)


class QueryError(ValueError):
    """A query outside the supported subset of PromQL."""


def parse_exposition(text: str, model: str) -> dict[str, float]:
    """The values of SCRAPED series of `model` in a Prometheus text exposition, each summed
    over the label sets it has."""
    return model_sums(text, SCRAPED, model)


class MetricStore:
    """Scraped samples: name -> series key -> deque of (t, value)."""

    def __init__(self, history: float = HISTORY_S) -> None:
        self.history = history
        self.series: dict[str, dict[object, deque]] = {name: {} for name in KNOWN}
        self.present: set = set()  # the targets of the latest scrape round
        self.rounds = 0

    def scrape_round(self, t: float, samples: dict[object, dict[str, float]]) -> None:
        """One round of scrapes at `t`: target key -> its values (a target that did not
        answer is left out, and so becomes stale)."""
        self.rounds += 1
        self.present = set(samples)
        cutoff = t - self.history
        for key, values in samples.items():
            for name, value in values.items():
                by_key = self.series.setdefault(name, {})
                q = by_key.get(key)
                if q is None:
                    q = by_key[key] = deque()
                q.append((t, value))
                while q and q[0][0] < cutoff:
                    q.popleft()

    def latest(self, name: str, now: float) -> dict[object, float]:
        """Each present series' last value at or before `now`."""
        out = {}
        for key, q in self.series.get(name, {}).items():
            if key not in self.present or not q:
                continue
            if q[-1][0] <= now:
                out[key] = q[-1][1]
                continue
            for t, value in reversed(q):
                if t <= now:
                    out[key] = value
                    break
        return out

    def rate(self, name: str, window: float, now: float, instant: bool = False) -> dict[object, float]:
        """Per present series: the per-second increase over (now - window, now] (counter
        resets counted as Prometheus does); `instant`: of the last two samples (irate)."""
        out = {}
        for key, q in self.series.get(name, {}).items():
            if key not in self.present:
                continue
            points = [(t, v) for t, v in q if now - window < t <= now]
            if instant:
                points = points[-2:]
            if len(points) < 2:
                continue
            increase, prev = 0.0, points[0][1]
            for _, v in points[1:]:
                increase += v - prev if v >= prev else v
                prev = v
            span = points[-1][0] - points[0][0]
            if span > 0:
                out[key] = increase / span
        return out


_AGGS = ("sum", "avg", "max", "min", "count")
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SELECTOR = re.compile(rf"^\s*({_NAME})\s*(?:\{{([^}}]*)\}})?\s*$")
_RANGE = re.compile(r"^\s*(rate|irate)\s*\(\s*(.*?)\s*\[\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*\]\s*\)\s*$")
_AGG = re.compile(r"^\s*(sum|avg|max|min|count)\s*\((.*)\)\s*$", re.S)
_MATCHER = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"([^"]*)"\s*$')
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True, slots=True)
class Query:
    text: str
    name: str
    agg: str = ""  # "" = the vector itself (its only element's value)
    func: str = ""  # "", rate, irate
    range_s: float = 0.0
    model: str | None = None  # model_name="..."
    engine: str | None = None  # engine="i"

    def evaluate(self, store: MetricStore, now: float, model: str) -> float | None:
        """The query's value at `now`; None for an empty result."""
        if self.model is not None and self.model != model:
            values: dict = {}
        elif self.func:
            values = store.rate(self.name, self.range_s, now, self.func == "irate")
        else:
            values = store.latest(self.name, now)
        if self.engine is not None:
            values = {k: v for k, v in values.items() if str(k) == self.engine}
        if not values:
            return 0.0 if self.agg == "count" else None
        xs = list(values.values())
        if self.agg == "sum":
            return sum(xs)
        if self.agg == "avg":
            return sum(xs) / len(xs)
        if self.agg == "max":
            return max(xs)
        if self.agg == "min":
            return min(xs)
        if self.agg == "count":
            return float(len(xs))
        if len(xs) > 1:  # as KEDA's Prometheus scaler: one element or an error
            raise QueryError(f"{self.text}: returned {len(xs)} series; aggregate them "
                             "(sum, avg, max, min, count)")
        return xs[0]


def parse_query(text: str) -> Query:
    """The supported subset of PromQL (see the module's docstring)."""
    if not isinstance(text, str) or not text.strip():
        raise QueryError("a query: expected a PromQL expression such as "
                         "sum(vllm:num_requests_waiting)")
    inner, agg = text, ""
    m = _AGG.match(text)
    if m:
        agg, inner = m.group(1), m.group(2)
    elif re.match(r"^\s*\w+\s*(?:by|without)\b", text) or re.match(r"^\s*\w+\s*\(", text) and \
            not _RANGE.match(text):
        word = re.match(r"^\s*(\w+)", text).group(1)
        raise QueryError(f"{text}: {word!r} is not supported (supported: {', '.join(_AGGS)} "
                         "of a selector or of rate/irate(selector[range]))")
    func, range_s = "", 0.0
    r = _RANGE.match(inner)
    if r:
        func, inner = r.group(1), r.group(2)
        range_s = float(r.group(3)) * _UNITS[r.group(4)]
        if range_s <= 0:
            raise QueryError(f"{text}: the range must be > 0")
    s = _SELECTOR.match(inner)
    if not s:
        raise QueryError(f"{text}: expected a metric name with optional {{label=\"value\"}} "
                         "matchers (by, without, arithmetic and functions other than rate "
                         "and irate are not supported)")
    name, matchers = s.group(1), s.group(2)
    if name not in KNOWN:
        raise QueryError(f"{text}: unknown metric {name!r} (known: {', '.join(KNOWN)})")
    if func and name not in COUNTERS:
        raise QueryError(f"{text}: {func} of {name!r}, which is a gauge (counters: "
                         f"{', '.join(COUNTERS)})")
    labels: dict[str, str] = {}
    for part in (matchers or "").split(","):
        if not part.strip():
            continue
        mm = _MATCHER.match(part)
        if not mm:
            raise QueryError(f"{text}: matcher {part.strip()!r}: only label=\"value\" is supported")
        if mm.group(1) not in ("model_name", "engine"):
            raise QueryError(f"{text}: label {mm.group(1)!r} is not supported (model_name, engine)")
        labels[mm.group(1)] = mm.group(2)
    return Query(text, name, agg, func, range_s, labels.get("model_name"), labels.get("engine"))


@dataclass(frozen=True, slots=True)
class Pod:
    """One replica as the scale target lists it."""

    index: int
    ready: bool  # passing its readiness check (serving)
    starting: bool  # created, still within its start-up delay
    draining: bool  # being removed: admits nothing, finishes what it holds


@dataclass(slots=True)
class FleetView:
    """What one decision sees at `now`. `replicas`: the scale target's replica count (the
    replicas asked for: starting and ready ones, not draining ones)."""

    now: float
    replicas: int
    pods: list[Pod]
    store: MetricStore
    model: str
    delay: float = 0.0  # the metrics pipeline's delay: samples newer than now - delay are unseen
    _parsed: dict = field(default_factory=dict)

    @property
    def ready(self) -> int:
        return sum(1 for p in self.pods if p.ready)

    def query(self, text: str) -> float | None:
        q = self._parsed.get(text)
        if q is None:
            q = self._parsed[text] = parse_query(text)
        return q.evaluate(self.store, self.now - self.delay, self.model)

    def pod_values(self, name: str) -> dict[int, float]:
        """The latest scraped value of metric `name` of each replica that has one."""
        return {k: v for k, v in self.store.latest(name, self.now - self.delay).items()
                if k != FRONT}


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)
