"""What an autoscaling run cost and achieved, against an oracle: summary.json's
`autoscaling` section, from the records of a fleet's run.

- SLO attainment: the share of the load's requests (every one the client issued: a 503
  for want of a ready replica, a full queue's refusal and a shed request all miss) that got a 200 within
  the SLO's TTFT and end-to-end bounds; overall and per oracle window.
- GPU-hours: replica-seconds (every replica that exists, starting, ready or draining,
  integrated over the run from the replica set the runner read) x GPUs per replica /
  3600. Cold starts: replicas created by scaling (each one takes the start-up delay).
- The oracle: for each window of `slo.window` seconds, the fewest replicas that would
  have met the SLO for the requests that arrived in it: ceil(arrival rate / capacity),
  where the capacity is the most requests per second one replica serves at the SLO's
  attainment (inference_lab.autoscale.capacity: the offline simulator with the load's
  own lengths). It knows each window's load in advance and starts replicas instantly, so
  it is a lower bound no autoscaler reaches; `cost_vs_oracle` is the autoscaler's
  GPU-hours over the oracle's.

Knows numpy and the records' columns. Does not know HTTP or matplotlib.
"""

from __future__ import annotations

import math

import numpy as np

from inference_lab.autoscale.capacity import replicas_needed
from inference_lab.experiments.outcomes import refused as refusals
from inference_lab.experiments.scenario import Scenario

__all__ = ["fleet_summary", "step_integral", "slo_met"]


def step_integral(t: np.ndarray, v: np.ndarray, start: float, end: float) -> float:
    """The integral over [start, end] of a step function (v[i] from t[i] on; before t[0]
    its first value)."""
    if t.size == 0 or end <= start:
        return 0.0
    order = np.argsort(t, kind="stable")
    t, v = np.clip(t[order], start, end), v[order].astype(float)
    edges = np.concatenate(([start], t[1:], [end])) if t[0] <= start else np.concatenate(([start], t, [end]))
    values = v if t[0] <= start else np.concatenate(([v[0]], v))
    return float(np.sum(values * np.diff(edges)))


def slo_met(req: dict, slo) -> np.ndarray:
    ok = req["status"] == 200
    if slo.ttft_s is not None:
        ok &= np.nan_to_num(req["ttft_s"], nan=np.inf) <= slo.ttft_s
    if slo.e2e_s is not None:
        ok &= np.nan_to_num(req["e2e_s"], nan=np.inf) <= slo.e2e_s
    return ok


def fleet_summary(scenario: Scenario, run: dict, gpus_per_replica: int,
                  capacity_rps: float | None) -> dict:
    req, fleet, scaling = run["requests"], run.get("fleet"), run.get("scaling")
    duration, slo = scenario.duration, scenario.slo
    n = int(req["status"].size)
    status = req["status"]
    refused = refusals(status, req["error"])  # a replica's full queue (a 529; SGLang's 503)
    replica_s = 0.0
    if fleet is not None and fleet["t"].size:
        existing = fleet["replicas"] + fleet["draining"]
        replica_s = step_integral(fleet["t"], existing, 0.0, duration)
    out = {
        "requests": n,
        "ok": int(np.count_nonzero(status == 200)),
        "n_529": int(np.count_nonzero(refused)),
        "n_503": int(np.count_nonzero((status == 503) & ~refused)),
        "shed": int(np.count_nonzero(status == 0)),
        "gpus_per_replica": gpus_per_replica,
        "replica_seconds": replica_s,
        "gpu_hours": replica_s * gpus_per_replica / 3600.0,
        "cold_starts": int(scaling["added"].sum()) if scaling is not None and scaling["added"].size else 0,
        "scalings": int(scaling["t"].size) if scaling is not None else 0,
        "peak_replicas": int(fleet["replicas"].max()) if fleet is not None and fleet["t"].size else None,
        "mean_replicas": replica_s / duration if duration else None,
        "slo": None, "attainment": None, "oracle": None, "cost_vs_oracle": None,
    }
    if slo is None:
        return out
    met = slo_met(req, slo)
    out["slo"] = {"ttft_s": slo.ttft_s, "e2e_s": slo.e2e_s, "attainment": slo.attainment,
                  "window_s": slo.window}
    out["attainment"] = float(met.mean()) if n else None
    edges = np.arange(0.0, duration + 1e-9, slo.window)
    if edges[-1] < duration:
        edges = np.append(edges, duration)
    idx = np.searchsorted(edges, req["due_s"], side="right") - 1
    inside = (idx >= 0) & (idx < edges.size - 1)
    counts = np.bincount(idx[inside], minlength=edges.size - 1)[:edges.size - 1]
    met_counts = np.bincount(idx[inside], weights=met[inside].astype(float),
                             minlength=edges.size - 1)[:edges.size - 1]
    widths = np.diff(edges)
    windows = {"start_s": edges[:-1].tolist(), "arrivals": counts.tolist(),
               "attainment": [float(m / c) if c else None for m, c in zip(met_counts, counts)],
               "windows_met": int(sum(1 for m, c in zip(met_counts, counts)
                                      if c and m / c >= slo.attainment)),
               "windows": int(sum(1 for c in counts if c))}
    if fleet is not None and fleet["t"].size:
        existing = fleet["replicas"] + fleet["draining"]
        windows["mean_replicas"] = [step_integral(fleet["t"], existing, a, b) / (b - a)
                                    for a, b in zip(edges[:-1], edges[1:])]
    out["windows"] = windows
    if capacity_rps is not None:
        needed = [replicas_needed(c / w, capacity_rps) for c, w in zip(counts, widths)]
        finite = all(math.isfinite(x) for x in needed)
        oracle_s = float(sum(x * w for x, w in zip(needed, widths))) if finite else math.inf
        out["oracle"] = {
            "capacity_rps": capacity_rps,
            "replicas": needed if finite else None,
            "replica_seconds": oracle_s,
            "gpu_hours": oracle_s * gpus_per_replica / 3600.0,
            "peak_replicas": max(needed) if finite and needed else None,
        }
        if finite and oracle_s > 0:
            out["cost_vs_oracle"] = replica_s / oracle_s
    return out
