"""An autoscaler on a latency SLO, using the lab's own capacity model: it knows, from the
offline simulator, how many requests per second one replica serves while meeting the SLO
(`capacity_rps`, inference_lab.autoscale.capacity), so it scales on the arrival rate the
load balancer in front counts rather than on a queue that has already grown.

Every `interval` (default 15 s): rate = the query (default: the front's requests per
second over the last minute); wanted = ceil(rate / (capacity_rps x target_utilization)),
at least `min_replicas` (default 1; 0 allows scaling to zero) and at most
`max_replicas`. Scale-up is immediate; scale-down takes the largest wanted count of the
last `scale_down_window` (default 120 s), as the HPA's stabilization does, so that a
dip does not drain replicas a minute before they are needed again.

Knows its rule; time is passed in. Does not know HTTP or how the capacity is computed.
"""

from __future__ import annotations

import math

from inference_lab.autoscale.metrics import FRONT_REQUESTS, FleetView, parse_query

__all__ = ["SLOScaler"]


class SLOScaler:
    name = "slo"

    def __init__(self, capacity_rps: float, target_utilization: float = 0.8,
                 interval: float = 15.0, scale_down_window: float = 120.0,
                 min_replicas: int = 1, max_replicas: int = 16,
                 query: str = f"sum(rate({FRONT_REQUESTS}[1m]))") -> None:
        parse_query(query)
        if not capacity_rps > 0:
            raise ValueError(f"capacity_rps must be > 0, got {capacity_rps}")
        if not 0 < target_utilization <= 1:
            raise ValueError(f"target_utilization must be in (0, 1], got {target_utilization}")
        if not interval > 0 or scale_down_window < 0:
            raise ValueError("interval must be > 0 and scale_down_window >= 0")
        if not 0 <= min_replicas <= max_replicas or max_replicas < 1:
            raise ValueError(f"expected 0 <= min_replicas ({min_replicas}) <= max_replicas "
                             f"({max_replicas}), max_replicas >= 1")
        self.capacity_rps, self.target_utilization = float(capacity_rps), float(target_utilization)
        self.interval, self.scale_down_window = float(interval), float(scale_down_window)
        self.min_replicas, self.max_replicas = min_replicas, max_replicas
        self.query = query
        self.wanted: list[tuple[float, int]] = []
        self.last: dict = {}

    def decide(self, now: float, view: FleetView) -> int | None:
        rate = view.query(self.query) or 0.0
        wanted = math.ceil(rate / (self.capacity_rps * self.target_utilization) - 1e-9)
        wanted = min(max(wanted, self.min_replicas), self.max_replicas)
        self.wanted = [(t, w) for t, w in self.wanted if t > now - self.scale_down_window]
        self.wanted.append((now, wanted))
        desired = max(w for _, w in self.wanted)
        self.last = {"metric": rate, "wanted": wanted}
        return desired if desired != view.replicas else None
