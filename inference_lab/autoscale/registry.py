"""Autoscalers by name, with their published defaults overridden by a scenario's params;
or a user's own class, named `package.module:ClassName`.

The interface every autoscaler has (the reference ones and a user's alike):
- `interval`: seconds between two calls of `decide` (the first at the start of the run);
- `decide(now, view) -> int | None`: the replicas the scale target should have, or None
  to leave it (inference_lab.autoscale.metrics.FleetView: the replica count, each pod's
  state, PromQL over the scraped metrics);
- optionally `last`: a dict of what it saw at its last decision (recorded beside it).

Knows the names and how to build each. Does not know the runner.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

from inference_lab.autoscale.hpa import HorizontalPodAutoscaler
from inference_lab.autoscale.keda import KedaPrometheusScaler
from inference_lab.autoscale.slo import SLOScaler

__all__ = ["AUTOSCALERS", "make_autoscaler", "AutoscalerError"]

AUTOSCALERS = {"hpa": HorizontalPodAutoscaler, "keda": KedaPrometheusScaler, "slo": SLOScaler}


class AutoscalerError(ValueError):
    """An unknown autoscaler, a bad parameter, or a user class that lacks the interface."""


def load_class(name: str):
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise AutoscalerError(f"unknown autoscaler {name!r}: one of {', '.join(AUTOSCALERS)}, "
                              "or a class of your own as package.module:ClassName")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AutoscalerError(f"autoscaler {name!r}: cannot import {module_name}: {exc}") from None
    cls = getattr(module, attr, None)
    if cls is None or not callable(cls):
        raise AutoscalerError(f"autoscaler {name!r}: {module_name} has no class {attr}")
    return cls


def make_autoscaler(name: str, params: dict | None = None,
                    capacity: Callable[[], float] | None = None):
    """An autoscaler by name with `params` as its keyword arguments. For `slo` without a
    `capacity_rps`, `capacity()` gives it (the lab's capacity model)."""
    cls = AUTOSCALERS.get(name) or load_class(name)
    params = dict(params or {})
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):
        signature = None
    if signature is not None and not any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        for key in params:
            if key not in signature.parameters:
                raise AutoscalerError(f"autoscaler {name!r} has no parameter {key!r}: one of "
                                      f"{', '.join(signature.parameters)}")
    if cls is SLOScaler and "capacity_rps" not in params:
        if capacity is None:
            raise AutoscalerError("autoscaler 'slo' needs capacity_rps (or the scenario's "
                                  "[slo] and load to compute it)")
        params["capacity_rps"] = capacity()
    try:
        scaler = cls(**params)
    except (TypeError, ValueError) as exc:
        raise AutoscalerError(f"autoscaler {name!r}: {exc}") from None
    interval = getattr(scaler, "interval", None)
    if (not callable(getattr(scaler, "decide", None)) or isinstance(interval, bool)
            or not isinstance(interval, (int, float)) or not interval > 0):
        raise AutoscalerError(f"autoscaler {name!r}: expected an object with `interval` "
                              "(seconds > 0) and `decide(now, view) -> int | None`")
    return scaler
