"""Kubernetes' HorizontalPodAutoscaler (autoscaling/v2), as its controller computes it
(kubernetes/kubernetes, pkg/controller/podautoscaler: replica_calculator.go and
horizontal.go), for a Pods metric with an AverageValue target, or an External metric
with an AverageValue target (the HPA that KEDA creates).

One sync (every `sync_period`, the controller's --horizontal-pod-autoscaler-sync-period,
default 15 s):

1. The replicas the metric asks for (`calcPlainMetricReplicas`): of the pods of the scale
   target, a draining one is ignored; one without a current sample is *missing* (a
   starting vLLM pod serves no /metrics until its engine is up). usageRatio = mean of the
   present pods' values / target. Without missing pods: within the tolerance (|1 - ratio|
   <= 0.1) keep the current count, else ceil(ratio x pods with metrics). With missing
   pods: count them at the target on a scale-down, at 0 on a scale-up, recompute, and
   keep the current count if that is within the tolerance or flips the direction. No pod
   with a sample: no decision (the controller's FailedGetPodsMetric). External metrics
   (`GetExternalPerPodMetricReplicas`): ratio = value / (target x current replicas); out
   of the tolerance, ceil(value / target).
2. Bounds: current > maxReplicas -> max; current < minReplicas -> min; current = 0 with
   minReplicas > 0: scaling is off (KEDA's zero).
3. Behaviour (`normalizeDesiredReplicasWithBehaviors`): stabilization keeps every
   recommendation of the last window; the result is max(recommendations of the last
   scaleDown.stabilizationWindowSeconds) when going down and min(those of the
   scaleUp window) when going up (defaults 300 s and 0 s). Then the scaling policies cap
   the change: over each policy's period, from the replica count at the period's start
   (the current count less the changes made within it), Pods adds or removes that many,
   Percent that percentage (rounded up when adding, down when removing); selectPolicy
   Max takes the policy allowing the largest change, Min the smallest, Disabled none.
   Defaults: up {Percent 100, Pods 4} per 15 s, Max; down {Percent 100} per 15 s, Max.

Knows the algorithm and its defaults; time is passed in. Does not know HTTP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inference_lab.autoscale.metrics import FleetView

__all__ = ["ScalingPolicy", "ScalingRules", "HPA", "HorizontalPodAutoscaler", "behavior"]

TOLERANCE = 0.1
SYNC_PERIOD_S = 15.0
DOWN_STABILIZATION_S = 300.0


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    type: str  # "Pods" | "Percent"
    value: int
    period: float  # seconds


@dataclass(frozen=True, slots=True)
class ScalingRules:
    stabilization_window: float
    policies: tuple[ScalingPolicy, ...]
    select: str = "Max"  # "Max" | "Min" | "Disabled"


SCALE_UP = ScalingRules(0.0, (ScalingPolicy("Percent", 100, 15.0), ScalingPolicy("Pods", 4, 15.0)))
SCALE_DOWN = ScalingRules(DOWN_STABILIZATION_S, (ScalingPolicy("Percent", 100, 15.0),))


def behavior(spec: dict | None, default: ScalingRules, where: str) -> ScalingRules:
    """ScalingRules from the HPA's `behavior.scaleUp`/`scaleDown` shape (as TOML/JSON):
    {stabilizationWindowSeconds, selectPolicy, policies = [{type, value, periodSeconds}]};
    absent fields keep the defaults. ValueError naming the field."""
    if spec is None:
        return default
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: expected a table with stabilizationWindowSeconds, "
                         "selectPolicy, policies")
    unknown = set(spec) - {"stabilizationWindowSeconds", "selectPolicy", "policies"}
    if unknown:
        raise ValueError(f"{where}: unknown field {sorted(unknown)[0]!r} (stabilizationWindowSeconds, "
                         "selectPolicy, policies)")
    window = spec.get("stabilizationWindowSeconds", default.stabilization_window)
    if isinstance(window, bool) or not isinstance(window, (int, float)) or not 0 <= window <= 3600:
        raise ValueError(f"{where}.stabilizationWindowSeconds: expected seconds in [0, 3600], got {window!r}")
    select = spec.get("selectPolicy", default.select)
    if select not in ("Max", "Min", "Disabled"):
        raise ValueError(f"{where}.selectPolicy: expected Max, Min or Disabled, got {select!r}")
    policies = default.policies
    if "policies" in spec:
        raw = spec["policies"]
        if not isinstance(raw, list) or not raw:
            raise ValueError(f"{where}.policies: expected a non-empty array of {{type, value, periodSeconds}}")
        policies = []
        for i, p in enumerate(raw):
            at = f"{where}.policies[{i}]"
            if not isinstance(p, dict) or set(p) - {"type", "value", "periodSeconds"}:
                raise ValueError(f"{at}: expected {{type, value, periodSeconds}}")
            if p.get("type") not in ("Pods", "Percent"):
                raise ValueError(f"{at}.type: expected Pods or Percent, got {p.get('type')!r}")
            value, period = p.get("value"), p.get("periodSeconds")
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{at}.value: expected an integer > 0, got {value!r}")
            if isinstance(period, bool) or not isinstance(period, (int, float)) or not 0 < period <= 1800:
                raise ValueError(f"{at}.periodSeconds: expected seconds in (0, 1800], got {period!r}")
            policies.append(ScalingPolicy(p["type"], value, float(period)))
        policies = tuple(policies)
    return ScalingRules(float(window), policies, select)


class HPA:
    """The controller's state for one HPA: its recommendations and scale events."""

    def __init__(self, min_replicas: int, max_replicas: int, tolerance: float = TOLERANCE,
                 scale_up: ScalingRules = SCALE_UP, scale_down: ScalingRules = SCALE_DOWN) -> None:
        if not 0 <= min_replicas <= max_replicas:
            raise ValueError(f"min_replicas ({min_replicas}) must be in [0, max_replicas = {max_replicas}]")
        if not 0 <= tolerance < 1:
            raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
        self.min_replicas, self.max_replicas, self.tolerance = min_replicas, max_replicas, tolerance
        self.scale_up, self.scale_down = scale_up, scale_down
        self.recommendations: list[tuple[float, int]] = []  # (time, unstabilized recommendation)
        self.up_events: list[tuple[float, int]] = []  # (time, replicas added)
        self.down_events: list[tuple[float, int]] = []

    # ---- step 1: the metric's proposal ------------------------------------------------------
    def pods_proposal(self, current: int, view: FleetView, metric: str, target: float) -> int | None:
        values = view.pod_values(metric)
        active = [p for p in view.pods if not p.draining]
        metrics = {p.index: values[p.index] for p in active if p.index in values}
        missing = [p.index for p in active if p.index not in values]
        if not metrics:
            return None  # did not receive metrics for any ready pods
        ready_count = len(metrics)
        ratio = sum(metrics.values()) / len(metrics) / target
        if not missing:
            if abs(1.0 - ratio) <= self.tolerance:
                return current
            return math.ceil(ratio * ready_count)
        fill = target if ratio < 1.0 else 0.0
        for index in missing:
            metrics[index] = fill
        new_ratio = sum(metrics.values()) / len(metrics) / target
        if (abs(1.0 - new_ratio) <= self.tolerance or (ratio < 1.0 < new_ratio)
                or (ratio > 1.0 > new_ratio)):
            return current
        proposal = math.ceil(new_ratio * len(metrics))
        if (new_ratio < 1.0 and proposal > current) or (new_ratio > 1.0 and proposal < current):
            return current
        return proposal

    def external_proposal(self, current: int, value: float, target: float) -> int:
        ratio = value / (target * current) if current else math.inf
        if abs(1.0 - ratio) > self.tolerance:
            return math.ceil(value / target)
        return current

    # ---- steps 2 and 3 -----------------------------------------------------------------------
    def reconcile(self, now: float, current: int, proposal: int | None) -> int | None:
        """The replicas to scale to, or None to leave the target as it is."""
        if current == 0 and self.min_replicas != 0:
            return None  # autoscaling is disabled for a target scaled to zero
        if current > self.max_replicas:
            desired = self.max_replicas
        elif current < self.min_replicas:
            desired = self.min_replicas
        elif proposal is None:
            return None  # no metrics: no decision
        else:
            desired = self._normalize(now, current, proposal)
        if desired == current:
            return None
        if desired > current:
            self.up_events.append((now, desired - current))
        else:
            self.down_events.append((now, current - desired))
        return desired

    def _normalize(self, now: float, current: int, desired: int) -> int:
        stabilized = self._stabilize(now, current, desired)
        return self._rate_limit(now, current, stabilized)

    def _stabilize(self, now: float, current: int, desired: int) -> int:
        up_cutoff = now - self.scale_up.stabilization_window
        down_cutoff = now - self.scale_down.stabilization_window
        up, down = desired, desired
        for t, rec in self.recommendations:
            if t > up_cutoff:
                up = min(rec, up)
            if t > down_cutoff:
                down = max(rec, down)
        keep = min(up_cutoff, down_cutoff)  # what either window still holds
        self.recommendations = [(t, r) for t, r in self.recommendations if t >= keep]
        self.recommendations.append((now, desired))
        recommendation = max(current, up)
        return min(recommendation, down)

    @staticmethod
    def _changed(events: list[tuple[float, int]], period: float, now: float) -> int:
        return sum(n for t, n in events if now - t < period)

    def _rate_limit(self, now: float, current: int, desired: int) -> int:
        if desired > current:
            limit = self._limit(now, current, self.scale_up, up=True)
            limit = max(limit, current)
            return min(desired, self.max_replicas, limit)
        if desired < current:
            limit = self._limit(now, current, self.scale_down, up=False)
            limit = min(limit, current)
            return max(desired, self.min_replicas, limit)
        return desired

    def _limit(self, now: float, current: int, rules: ScalingRules, up: bool) -> int:
        if rules.select == "Disabled":
            return current
        proposals = []
        for p in rules.policies:
            start = (current - self._changed(self.up_events, p.period, now)
                     + self._changed(self.down_events, p.period, now))
            if p.type == "Pods":
                proposals.append(start + p.value if up else start - p.value)
            elif up:
                proposals.append(math.ceil(start * (1 + p.value / 100)))
            else:
                proposals.append(int(start * (1 - p.value / 100)))
        largest_change = max if up else min
        smallest_change = min if up else max
        return (largest_change if rules.select == "Max" else smallest_change)(proposals)


class HorizontalPodAutoscaler:
    """The HPA on a Pods metric (prometheus-adapter serving a replica gauge per pod) with an
    AverageValue target: e.g. vllm:num_requests_waiting averaging `target` per replica."""

    name = "hpa"

    def __init__(self, metric: str = "vllm:num_requests_running", target: float = 32.0,
                 min_replicas: int = 1, max_replicas: int = 16, tolerance: float = TOLERANCE,
                 sync_period: float = SYNC_PERIOD_S, scale_up: dict | None = None,
                 scale_down: dict | None = None) -> None:
        from inference_lab.autoscale.metrics import SCRAPED

        if metric not in SCRAPED:
            raise ValueError(f"metric {metric!r}: one of the replicas' series "
                             f"({', '.join(SCRAPED)})")
        if not target > 0:
            raise ValueError(f"target must be > 0, got {target}")
        if not sync_period > 0:
            raise ValueError(f"sync_period must be > 0, got {sync_period}")
        self.metric, self.target = metric, float(target)
        self.interval = float(sync_period)
        self.hpa = HPA(min_replicas, max_replicas, tolerance,
                       behavior(scale_up, SCALE_UP, "scale_up"),
                       behavior(scale_down, SCALE_DOWN, "scale_down"))
        self.last = {}

    @property
    def min_replicas(self) -> int:
        return self.hpa.min_replicas

    @property
    def max_replicas(self) -> int:
        return self.hpa.max_replicas

    def decide(self, now: float, view: FleetView) -> int | None:
        current = view.replicas
        proposal = None if current == 0 else self.hpa.pods_proposal(current, view, self.metric, self.target)
        values = view.pod_values(self.metric)
        self.last = {"metric": (sum(values.values()) / len(values)) if values else None,
                     "proposal": proposal}
        return self.hpa.reconcile(now, current, proposal)
