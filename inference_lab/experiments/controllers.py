"""Reference client-side concurrency controllers behind one interface.

Knows the published update rules and their default parameters (each class's docstring
says where they come from); time is passed in (seconds, modelled), never read, so every
rule is a pure function of the outcomes it is fed and the tests drive them by hand.
Does not know HTTP or the scenario: the runner turns responses into outcomes.

The interface (Controller):
- `acquire(now) -> Ticket | None`: a slot for one request, or None (no slot: a closed-loop
  user waits for a release, an open-loop arrival is shed on the client).
- `release(ticket, now, outcome, rtt)`: the request ended; outcome is OK, DROPPED (a full queue's refusal,
  experiments.outcomes: the server refused for overload) or IGNORED (any other error: says nothing about
  capacity). `rtt` is the latency sample (seconds) the algorithm measures.
- `limit`: the current concurrency limit (math.inf when there is none); `inflight`.

Outcomes map as in Netflix concurrency-limits' limiter listener (onSuccess / onDropped /
onIgnore): a drop is a sample with didDrop = true, an ignored request is no sample.
"""

from __future__ import annotations

import enum
import math
import random
from collections import deque
from dataclasses import dataclass

__all__ = ["Outcome", "Ticket", "Controller", "FixedLimit", "AIMDLimit", "VegasLimit",
           "Gradient2Limit", "EnvoyGradient", "SREThrottle", "CONTROLLERS", "make_controller"]


class Outcome(enum.IntEnum):
    OK = 0
    DROPPED = 1  # a full queue's refusal (experiments.outcomes): refused for overload
    IGNORED = 2  # any other failure


@dataclass(slots=True)
class Ticket:
    start: float  # when the slot was taken
    inflight: int  # in flight counting this one, at acquire (Netflix passes this to the limit)


class Controller:
    """Counts in-flight requests against `limit`; subclasses update the limit from samples."""

    name = "controller"

    def __init__(self, initial_limit: float) -> None:
        self._limit = initial_limit
        self.inflight = 0

    @property
    def limit(self) -> float:
        return self._limit

    def acquire(self, now: float) -> Ticket | None:
        if self.inflight >= self.limit:
            return None
        self.inflight += 1
        return Ticket(now, self.inflight)

    def release(self, ticket: Ticket, now: float, outcome: Outcome, rtt: float) -> None:
        self.inflight -= 1
        if outcome is not Outcome.IGNORED:
            self.on_sample(ticket, now, rtt, outcome is Outcome.DROPPED)

    def on_sample(self, ticket: Ticket, now: float, rtt: float, dropped: bool) -> None:
        """Update the limit from one latency sample (`dropped`: the server refused it, its queue full)."""


class FixedLimit(Controller):
    """A constant limit: the baseline every adaptive controller is compared with
    (Netflix concurrency-limits `FixedLimit`). `limit = 0` means no limit at all."""

    name = "fixed"

    def __init__(self, limit: int = 0) -> None:
        super().__init__(limit if limit > 0 else math.inf)


class AIMDLimit(Controller):
    """Additive increase, multiplicative decrease: Netflix concurrency-limits `AIMDLimit`
    (github.com/Netflix/concurrency-limits, concurrency-limits-core, limit/AIMDLimit.java).

    On a drop, or a sample slower than `timeout`: limit = int(limit x backoff_ratio).
    Otherwise, if the request was sent with in-flight x 2 >= limit: limit + 1 (no growth
    while the client is not using its limit). Then clamped to [min_limit, max_limit].
    Published defaults: initial 20, min 20, max 200, backoff ratio 0.9 (must be in
    [0.5, 1)), timeout 5 s.
    """

    name = "aimd"

    def __init__(self, initial_limit: int = 20, min_limit: int = 20, max_limit: int = 200,
                 backoff_ratio: float = 0.9, timeout: float = 5.0) -> None:
        if not 0.5 <= backoff_ratio < 1.0:
            raise ValueError(f"backoff_ratio must be in [0.5, 1.0), got {backoff_ratio}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        super().__init__(initial_limit)
        self.min_limit, self.max_limit = min_limit, max_limit
        self.backoff_ratio, self.timeout = backoff_ratio, timeout

    def on_sample(self, ticket: Ticket, now: float, rtt: float, dropped: bool) -> None:
        limit = self._limit
        if dropped or rtt > self.timeout:
            limit = int(limit * self.backoff_ratio)
        elif ticket.inflight * 2 >= limit:
            limit += 1
        self._limit = min(self.max_limit, max(self.min_limit, limit))


def log10_root(n: int) -> int:
    """max(1, int(log10(n))): Netflix's `Log10RootIntFunction` (1 below 100, 2 below 1,000)."""
    return max(1, int(math.log10(n))) if n >= 1 else 1


class VegasLimit(Controller):
    """TCP-Vegas-style delay-based limit: Netflix concurrency-limits `VegasLimit`
    (limit/VegasLimit.java).

    Keeps rtt_noload, the smallest RTT seen (re-probed: every `probe_multiplier` x limit x
    jitter samples, jitter uniform in [0.5, 1), the next sample becomes rtt_noload).
    queue = ceil(limit x (1 - rtt_noload / rtt)). On a drop: limit - log10(limit). While
    in-flight x 2 < limit: unchanged. Else, with alpha = 3 log10(limit), beta = 6
    log10(limit), threshold = log10(limit) (log10 as `log10_root`): queue <= threshold ->
    limit + beta; queue < alpha -> limit + log10(limit); queue > beta -> limit -
    log10(limit); otherwise unchanged. Clamped to [1, max_concurrency], then smoothed:
    (1 - smoothing) x old + smoothing x new. Published defaults: initial 20,
    max_concurrency 1000, smoothing 1.0, probe_multiplier 30.
    """

    name = "vegas"

    def __init__(self, initial_limit: int = 20, max_concurrency: int = 1000,
                 smoothing: float = 1.0, probe_multiplier: int = 30,
                 rng: random.Random | None = None) -> None:
        super().__init__(initial_limit)
        self.estimated = float(initial_limit)
        self.max_concurrency, self.smoothing = max_concurrency, smoothing
        self.probe_multiplier = probe_multiplier
        self.rtt_noload = 0.0
        self.probe_count = 0
        self._rng = rng or random.Random(0)
        self._jitter = self._rng.uniform(0.5, 1.0)

    def on_sample(self, ticket: Ticket, now: float, rtt: float, dropped: bool) -> None:
        if rtt <= 0:
            return
        self.probe_count += 1
        if self._jitter * self.probe_multiplier * self.estimated <= self.probe_count:
            self._jitter = self._rng.uniform(0.5, 1.0)
            self.probe_count = 0
            self.rtt_noload = rtt  # probe: take this sample as the new no-load RTT
            return
        if self.rtt_noload == 0 or rtt < self.rtt_noload:
            self.rtt_noload = rtt
            return
        est = self.estimated
        n = int(est)
        queue = math.ceil(est * (1 - self.rtt_noload / rtt))
        if dropped:
            new = est - log10_root(n)
        elif ticket.inflight * 2 < est:
            return
        else:
            alpha, beta, threshold = 3 * log10_root(n), 6 * log10_root(n), log10_root(n)
            if queue <= threshold:
                new = est + beta
            elif queue < alpha:
                new = est + log10_root(n)
            elif queue > beta:
                new = est - log10_root(n)
            else:
                return
        new = max(1.0, min(self.max_concurrency, new))
        self.estimated = (1 - self.smoothing) * est + self.smoothing * new
        self._limit = int(self.estimated)


class Gradient2Limit(Controller):
    """Gradient of a short-term RTT against a long-term average: Netflix concurrency-limits
    `Gradient2Limit` (limit/Gradient2Limit.java).

    long_rtt is an exponential average over `long_window` samples (the first 10 averaged
    plainly); when long_rtt / rtt > 2 it is decayed by 0.95 (recovery after an overload).
    No change while in-flight < limit / 2. Else gradient = clamp(tolerance x long_rtt / rtt,
    0.5, 1.0); new = limit x gradient + queue_size; limit = limit x (1 - smoothing) + new x
    smoothing, clamped to [min_limit, max_concurrency]. A drop is a sample like any other
    (the published rule ignores didDrop). Published defaults: initial 20, min 20, max 200,
    smoothing 0.2, queue_size 4, long_window 600, rtt_tolerance 1.5.
    """

    name = "gradient2"

    def __init__(self, initial_limit: int = 20, min_limit: int = 20, max_concurrency: int = 200,
                 smoothing: float = 0.2, queue_size: int = 4, long_window: int = 600,
                 rtt_tolerance: float = 1.5) -> None:
        super().__init__(initial_limit)
        self.estimated = float(initial_limit)
        self.min_limit, self.max_concurrency = min_limit, max_concurrency
        self.smoothing, self.queue_size, self.tolerance = smoothing, queue_size, rtt_tolerance
        self._factor = 2.0 / (long_window + 1)
        self._warmup = 10
        self._count = 0
        self._sum = 0.0
        self.long_rtt = 0.0

    def _add_long(self, rtt: float) -> float:
        if self._count < self._warmup:
            self._count += 1
            self._sum += rtt
            self.long_rtt = self._sum / self._count
        else:
            self.long_rtt = self.long_rtt * (1 - self._factor) + rtt * self._factor
        return self.long_rtt

    def on_sample(self, ticket: Ticket, now: float, rtt: float, dropped: bool) -> None:
        if rtt <= 0:
            return
        est = self.estimated
        long_rtt = self._add_long(rtt)
        if long_rtt / rtt > 2:
            self.long_rtt *= 0.95
        if ticket.inflight < est / 2:
            return
        gradient = max(0.5, min(1.0, self.tolerance * long_rtt / rtt))
        new = est * gradient + self.queue_size
        new = est * (1 - self.smoothing) + new * self.smoothing
        self.estimated = max(self.min_limit, min(self.max_concurrency, new))
        self._limit = int(self.estimated)


class EnvoyGradient(Controller):
    """Envoy's adaptive-concurrency gradient controller (envoyproxy.io docs, "Adaptive
    Concurrency"; source/extensions/filters/http/adaptive_concurrency/controller).

    minRTT window: the limit is pinned to `min_concurrency` until `request_count` samples
    of requests sent inside the window are in; minRTT = their `percentile`; then the
    previous limit is restored and the next window starts `interval` (+ up to `jitter` of
    it) later, or at once after 5 consecutive sampling windows that left the limit at the
    minimum. Between: every `update_interval` the samples of that window are summarised
    (sampleRTT = `percentile`) and gradient = clamp((minRTT x (1 + buffer)) / sampleRTT,
    0.5, 2.0); limit = int(limit x gradient + sqrt(limit x gradient)), clamped to
    [min_concurrency, max_limit]. 529s are latency samples like any response (Envoy
    counts any completed request). Published defaults: percentile p50, max limit 1000,
    request_count 50, jitter 15 %, min_concurrency 3, buffer 25 %; `interval` (60 s in the
    docs' example) and `update_interval` (0.1 s there) have no default (required fields).
    """

    name = "envoy"

    def __init__(self, update_interval: float = 0.1, interval: float = 60.0,
                 percentile: float = 50.0, max_limit: int = 1000, request_count: int = 50,
                 jitter: float = 0.15, min_concurrency: int = 3, buffer: float = 0.25,
                 rng: random.Random | None = None) -> None:
        super().__init__(min_concurrency)
        self.update_interval, self.interval = update_interval, interval
        self.percentile, self.max_limit, self.request_count = percentile, max_limit, request_count
        self.jitter, self.min_concurrency, self.buffer = jitter, min_concurrency, buffer
        self._rng = rng or random.Random(0)
        self.min_rtt = 0.0
        self.sample_rtt = 0.0
        self.samples: list[float] = []
        self.in_min_rtt_window = False
        self._deferred = min_concurrency
        self._window_epoch = 0.0
        self._next_update = math.inf
        self._next_min_rtt = math.inf
        self._at_min = 0
        self._enter_min_rtt_window(0.0)

    def _summary(self) -> float:
        xs = sorted(self.samples)
        self.samples.clear()
        pos = (len(xs) - 1) * self.percentile / 100.0
        lo = math.floor(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    def _enter_min_rtt_window(self, now: float) -> None:
        if self.in_min_rtt_window:
            return
        self.in_min_rtt_window = True
        self._deferred = self._limit
        self._set_limit(self.min_concurrency)
        self.samples.clear()
        self._window_epoch = now
        self._next_update = math.inf

    def _set_limit(self, limit: int) -> None:
        old = self._limit
        self._limit = limit
        if not self.in_min_rtt_window and old == self.min_concurrency == limit:
            self._at_min += 1
        else:
            self._at_min = 0
        if self._at_min >= 5:
            self._next_min_rtt = self._next_update  # at the next tick

    def tick(self, now: float) -> None:
        """Run the timers that are due (called on every acquire and release)."""
        if now >= self._next_min_rtt and not self.in_min_rtt_window:
            self._next_min_rtt = math.inf
            self._enter_min_rtt_window(now)
            return
        while now >= self._next_update and not self.in_min_rtt_window:
            self._next_update += self.update_interval
            if self.samples:
                self.sample_rtt = self._summary()
                self._set_limit(self._new_limit())
            if now >= self._next_min_rtt:
                self._next_min_rtt = math.inf
                self._enter_min_rtt_window(now)
                return

    def _new_limit(self) -> int:
        gradient = max(0.5, min(2.0, self.min_rtt * (1 + self.buffer) / self.sample_rtt))
        limit = self._limit * gradient
        new = int(limit + math.sqrt(limit))
        return max(self.min_concurrency, min(self.max_limit, new))

    def acquire(self, now: float) -> Ticket | None:
        self.tick(now)
        return super().acquire(now)

    def release(self, ticket: Ticket, now: float, outcome: Outcome, rtt: float) -> None:
        self.tick(now)
        self.inflight -= 1
        if outcome is Outcome.IGNORED or ticket.start < self._window_epoch:
            return  # errors say nothing; samples from before a minRTT window are dropped
        self.samples.append(rtt)
        if self.in_min_rtt_window and len(self.samples) >= self.request_count:
            self.min_rtt = self._summary()
            self.in_min_rtt_window = False
            self._set_limit(self._deferred)
            delay = self.interval + self._rng.uniform(0, self.interval * self.jitter)
            self._next_min_rtt = now + delay
            self._next_update = now + self.update_interval


class SREThrottle(Controller):
    """Client-side adaptive throttling from Google's SRE book ("Handling Overload",
    "Client-side throttling"): each client keeps, over the last two minutes, `requests`
    (attempted, including those it rejected itself) and `accepts` (answered without an
    overload refusal), and rejects a new request locally with probability
    max(0, (requests - K x accepts) / (requests + 1)). Published value: K = 2, a 2-minute
    history. There is no concurrency limit (`limit` is inf): the control is on the rate.
    """

    name = "sre"

    def __init__(self, k: float = 2.0, window: float = 120.0, bucket: float = 1.0,
                 rng: random.Random | None = None) -> None:
        super().__init__(math.inf)
        self.k, self.window, self.bucket = k, window, bucket
        self._rng = rng or random.Random(0)
        self._buckets: deque[list] = deque()  # [bucket start, requests, accepts]
        self.requests = 0
        self.accepts = 0

    def _slot(self, now: float) -> list:
        start = math.floor(now / self.bucket) * self.bucket
        buckets = self._buckets
        while buckets and buckets[0][0] <= now - self.window:
            _, r, a = buckets.popleft()
            self.requests -= r
            self.accepts -= a
        if not buckets or buckets[-1][0] != start:
            buckets.append([start, 0, 0])
        return buckets[-1]

    def reject_probability(self, now: float) -> float:
        self._slot(now)
        return max(0.0, (self.requests - self.k * self.accepts) / (self.requests + 1))

    def acquire(self, now: float) -> Ticket | None:
        p = self.reject_probability(now)
        self._slot(now)[1] += 1
        self.requests += 1
        if p > 0 and self._rng.random() < p:
            return None
        self.inflight += 1
        return Ticket(now, self.inflight)

    def on_sample(self, ticket: Ticket, now: float, rtt: float, dropped: bool) -> None:
        if not dropped:
            self._slot(now)[2] += 1
            self.accepts += 1


CONTROLLERS: dict[str, type[Controller]] = {
    c.name: c for c in (FixedLimit, AIMDLimit, VegasLimit, Gradient2Limit, EnvoyGradient,
                        SREThrottle)
}


def make_controller(name: str, params: dict | None = None, seed: int = 0) -> Controller:
    """A controller by name with its published defaults, overridden by `params`
    (keyword arguments of its class). Raises ValueError naming a bad name or parameter."""
    cls = CONTROLLERS.get(name)
    if cls is None:
        raise ValueError(f"unknown controller {name!r}: one of {', '.join(CONTROLLERS)}")
    params = dict(params or {})
    import inspect

    allowed = [p for p in inspect.signature(cls).parameters if p != "rng"]
    for key in params:
        if key not in allowed:
            raise ValueError(f"controller {name!r} has no parameter {key!r}: "
                             f"one of {', '.join(allowed)}")
    if "rng" in inspect.signature(cls).parameters:
        params["rng"] = random.Random(seed)
    try:
        return cls(**params)
    except TypeError as exc:
        raise ValueError(f"controller {name!r}: {exc}") from None
