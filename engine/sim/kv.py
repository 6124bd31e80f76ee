"""KV cache capacity in blocks, and the block count a request needs.

Knows the deployment's memory arithmetic. Block bytes count only full-context attention
layers: sliding-window layers hold a fixed, small per-request amount that is not paged.
The pool itself is a counter (engine.scheduler owns it): no block ids are simulated,
because nothing here models prefix sharing.
"""

from __future__ import annotations

from inference_lab.engine.sim.specs import BYTES_PER_VALUE, Deployment


def weight_bytes(deployment: Deployment) -> float:
    """Resident weight bytes across all GPUs of the deployment."""
    return sum(s.resident_params * BYTES_PER_VALUE[s.precision]
               for s in deployment.model.weight_streams)


def bytes_per_token(deployment: Deployment) -> float:
    """KV bytes one cached position takes in the paged (full-attention) layers."""
    model = deployment.model
    kv = BYTES_PER_VALUE[model.kv_precision]
    full = [layer for layer in model.layer_classes if not layer.window]
    layers = full or list(model.layer_classes)  # an all-windowed model pages its windows
    return sum(layer.count * 2 * layer.kv_heads * layer.head_dim * kv for layer in layers)


def kv_capacity_bytes(deployment: Deployment) -> float:
    sched = deployment.scheduler
    if sched.kv_cache_capacity is not None:
        return float(sched.kv_cache_capacity)
    hw = deployment.hardware
    return hw.hbm_bytes * deployment.tp * sched.gpu_memory_utilization - weight_bytes(deployment)


def total_blocks(deployment: Deployment) -> int:
    """Blocks of `block_size` positions that fit in the KV capacity (>= 0)."""
    block_bytes = bytes_per_token(deployment) * deployment.scheduler.block_size
    return max(int(kv_capacity_bytes(deployment) // block_bytes), 0)


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)
