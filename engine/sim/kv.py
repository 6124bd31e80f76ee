"""KV cache capacity in blocks, and the block count a request needs.

Knows the deployment's memory arithmetic, per GPU: the pool is what one GPU keeps after
its share of the weights (HBM x gpu_memory_utilization - weights / tp, less the
calibrated memory_reserve under --timing calibrated; or the configured
kv_cache_capacity / tp), a block is `block_size` positions of the paged layers' cache
on one GPU (engine.sim.layers: KV heads are never split, MLA latents are
replicated; stored at the scheduler's kv_cache_dtype), and a running sequence also holds `fixed_blocks` for its recurrent states.
The pool itself is a counter (engine.scheduler owns it): no block ids are simulated.
"""

from __future__ import annotations

from inference_lab.engine.sim import layers
from inference_lab.engine.sim.specs import Deployment


def weight_bytes(deployment: Deployment) -> float:
    """Resident weight bytes across all GPUs of the deployment."""
    return sum(s.resident_params * s.bytes_per_value
               for s in deployment.model.weight_streams)


def bytes_per_token(deployment: Deployment) -> float:
    """KV bytes one cached position takes on each GPU in the paged layers, at the
    deployment's kv_cache_dtype."""
    model = layers.with_kv_cache_dtype(deployment.model, deployment.scheduler.kv_cache_dtype)
    return layers.paged_bytes_per_token(model, deployment.tp)


def reserve_bytes(deployment: Deployment) -> float:
    """Bytes per GPU the engine keeps outside the weights and the pool: the calibrated
    memory_reserve (vLLM's profiled activation peak, buffers, workspaces) under
    calibrated timing, else 0 (the roofline's ideal arithmetic)."""
    cal = deployment.hardware.calibration
    return cal.memory_reserve if cal is not None and deployment.timing == "calibrated" else 0.0


def kv_capacity_bytes(deployment: Deployment) -> float:
    """Bytes of KV pool per GPU."""
    sched = deployment.scheduler
    if sched.kv_cache_capacity is not None:
        return float(sched.kv_cache_capacity) / deployment.tp
    hw = deployment.hardware
    return (hw.hbm_bytes * sched.gpu_memory_utilization - weight_bytes(deployment) / deployment.tp
            - reserve_bytes(deployment))


def total_blocks(deployment: Deployment) -> int:
    """Blocks of `block_size` positions that fit in the KV capacity (>= 0)."""
    block_bytes = bytes_per_token(deployment) * deployment.scheduler.block_size
    return max(int(kv_capacity_bytes(deployment) // block_bytes), 0)


def fixed_blocks(deployment: Deployment) -> int:
    """Blocks a running sequence holds whatever its length (its recurrent states)."""
    fixed = layers.fixed_bytes_per_sequence(deployment.model, deployment.tp)
    if not fixed:
        return 0
    return int(-(-fixed // (bytes_per_token(deployment) * deployment.scheduler.block_size)))


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)
