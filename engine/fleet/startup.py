"""The modelled start-up delay of a replica: how long a real vLLM pod takes to be ready.

Knows: `auto` = the resident weight bytes of the model, loaded onto its `tp` GPUs in
parallel at the hardware preset's `load_bandwidth` (bytes/s per GPU, host storage or page
cache to HBM), plus a fixed engine start-up (process, CUDA context, CUDA graph capture and
warm-up) of FIXED_STARTUP_S seconds. A number of seconds is used as given.

Does not know: clocks or timers (the fleet applies the delay); pure arithmetic.
"""

from __future__ import annotations

from inference_lab.engine.sim.catalog import weight_bytes
from inference_lab.engine.sim.specs import Deployment

# Process start, CUDA context, graph capture and warm-up of a vLLM engine of this size;
# about what vLLM logs between launch and "Application startup complete" once weights
# are cached locally, excluding the weight load itself.
FIXED_STARTUP_S = 20.0
AUTO = "auto"


def auto_startup_delay(deployment: Deployment) -> float:
    """Weights over the load bandwidth of `tp` GPUs loading in parallel, plus the fixed part."""
    load = weight_bytes(deployment.model) / (deployment.hardware.load_bandwidth * deployment.tp)
    return FIXED_STARTUP_S + load


def parse_startup_delay(text: str) -> float | str:
    """`auto` or a number of seconds >= 0 (ValueError otherwise, naming what was wrong)."""
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a number of seconds or 'auto', got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"expected a finite number of seconds >= 0, got {text!r}")
    return value


def startup_delay(deployment: Deployment, setting: float | str) -> float:
    """Seconds from a replica's creation until it is ready."""
    return auto_startup_delay(deployment) if setting == AUTO else float(setting)
