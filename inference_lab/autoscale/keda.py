"""KEDA's Prometheus scaler on a ScaledObject (kedacore/keda: pkg/scaling/executor/
scale_scaledobjects.go, pkg/scalers/prometheus_scaler.go): two loops over one query.

- The operator's loop, every `polling_interval` (default 30 s): the query's value (an
  empty result is 0: `ignoreNullValues` true) is *active* above `activation_threshold`
  (default 0). Active with the target at 0 replicas: scale to max(minReplicaCount, 1)
  and note the time (`lastActiveTime`); active otherwise: note the time. Inactive with
  replicas > 0 and minReplicaCount 0: scale to 0 once `cooldown_period` (default 300 s)
  has passed since the last active time (or, never active, `initial_cooldown_period`,
  default 0, since creation); inactive below minReplicaCount: scale to it.
- The HPA KEDA creates for it (inference_lab.autoscale.hpa, an External metric with an
  AverageValue target of `threshold`), every `sync_period` (15 s): replicas =
  ceil(value / threshold) when |1 - value / (threshold x current)| > tolerance, between
  max(minReplicaCount, 1) and maxReplicaCount (default 100), under the HPA's behaviour
  (`scale_up` / `scale_down`: KEDA's `advanced.horizontalPodAutoscalerConfig.behavior`).
  At 0 replicas the HPA does nothing: scaling from zero is the operator's.

A replica scaled from zero is a cold start: it takes its start-up delay before it
serves, and requests meanwhile find no ready replica (503).

Knows the two loops and their defaults; time is passed in. Does not know HTTP.
"""

from __future__ import annotations

import math

from inference_lab.autoscale.hpa import HPA, SCALE_DOWN, SCALE_UP, SYNC_PERIOD_S, TOLERANCE, behavior
from inference_lab.autoscale.metrics import FleetView, parse_query

__all__ = ["KedaPrometheusScaler"]


class KedaPrometheusScaler:
    name = "keda"

    def __init__(self, query: str = "sum(vllm:num_requests_waiting)", threshold: float = 8.0,
                 activation_threshold: float = 0.0, polling_interval: float = 30.0,
                 cooldown_period: float = 300.0, initial_cooldown_period: float = 0.0,
                 min_replica_count: int = 0, max_replica_count: int = 100,
                 tolerance: float = TOLERANCE, sync_period: float = SYNC_PERIOD_S,
                 ignore_null_values: bool = True, scale_up: dict | None = None,
                 scale_down: dict | None = None) -> None:
        parse_query(query)  # refuse a bad query now (QueryError is a ValueError)
        if not threshold > 0:
            raise ValueError(f"threshold must be > 0, got {threshold}")
        for name, value in (("polling_interval", polling_interval), ("sync_period", sync_period)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if cooldown_period < 0 or initial_cooldown_period < 0:
            raise ValueError("cooldown_period and initial_cooldown_period must be >= 0")
        if not 0 <= min_replica_count <= max_replica_count or max_replica_count < 1:
            raise ValueError(f"expected 0 <= min_replica_count ({min_replica_count}) <= "
                             f"max_replica_count ({max_replica_count}), max_replica_count >= 1")
        self.query, self.threshold = query, float(threshold)
        self.activation_threshold = float(activation_threshold)
        self.polling_interval, self.sync_period = float(polling_interval), float(sync_period)
        self.cooldown_period = float(cooldown_period)
        self.initial_cooldown_period = float(initial_cooldown_period)
        self.min_replica_count, self.max_replica_count = min_replica_count, max_replica_count
        self.ignore_null_values = ignore_null_values
        self.hpa = HPA(max(min_replica_count, 1), max_replica_count, tolerance,
                       behavior(scale_up, SCALE_UP, "scale_up"),
                       behavior(scale_down, SCALE_DOWN, "scale_down"))
        # The runner calls decide() every `interval`: both loops' periods are multiples of it.
        ms = math.gcd(round(self.polling_interval * 1000), round(self.sync_period * 1000))
        self.interval = max(ms, 1) / 1000.0
        self.created: float | None = None
        self.last_active: float | None = None
        self.next_poll = self.next_sync = 0.0
        self.last: dict = {}

    @property
    def min_replicas(self) -> int:
        return self.min_replica_count

    @property
    def max_replicas(self) -> int:
        return self.max_replica_count

    def _value(self, view: FleetView) -> float:
        value = view.query(self.query)
        if value is None:
            if not self.ignore_null_values:
                raise ValueError(f"{self.query}: empty result (ignore_null_values is false)")
            return 0.0
        return value

    def decide(self, now: float, view: FleetView) -> int | None:
        eps = 1e-9
        if self.created is None:
            self.created = self.next_poll = self.next_sync = now
        current, result = view.replicas, None
        if now + eps >= self.next_poll:
            self.next_poll += self.polling_interval
            value = self._value(view)
            active = value > self.activation_threshold
            self.last = {"metric": value, "active": active}
            if active:
                self.last_active = now
                if current == 0:
                    result = max(self.min_replica_count, 1)
            elif current > 0 and self.min_replica_count == 0:
                if self.last_active is None:  # never active: from the ScaledObject's creation
                    due = self.created + self.initial_cooldown_period < now
                else:
                    due = self.last_active + self.cooldown_period < now
                if due:
                    result = 0
            elif current < self.min_replica_count:
                result = self.min_replica_count
        if now + eps >= self.next_sync:
            self.next_sync += self.sync_period
            if result is None and current > 0:
                value = self._value(view)
                self.last["metric"] = value
                proposal = self.hpa.external_proposal(current, value, self.threshold)
                result = self.hpa.reconcile(now, current, proposal)
        return result if result != current else None
