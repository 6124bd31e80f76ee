"""The pure-data description of a deployment: hardware, model, scheduler knobs.

Frozen, slotted dataclasses, built by `engine.config` from TOML and read by the cost
model, the KV manager and the scheduler. Nothing here parses files or validates input.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Bytes per stored value for each precision name the catalog may use.
BYTES_PER_VALUE: dict[str, float] = {"fp4": 0.5, "fp8": 1.0, "bf16": 2.0, "fp16": 2.0, "fp32": 4.0}
# Precisions from narrowest to widest: a precision the hardware lacks is priced at the
# next wider one it has.
PRECISION_ORDER: tuple[str, ...] = ("fp4", "fp8", "bf16", "fp16", "fp32")


@dataclass(frozen=True, slots=True)
class Hardware:
    """One GPU: dense tensor-core peaks (no sparsity), HBM and the scale-up fabric."""

    name: str
    flops: dict[str, float]  # precision -> FLOP/s per GPU
    hbm_bandwidth: float  # bytes/s per GPU
    hbm_bytes: float  # bytes per GPU
    link_bandwidth: float  # scale-up bytes/s per direction per GPU
    link_latency: float = 5e-6  # seconds per collective


@dataclass(frozen=True, slots=True)
class WeightStream:
    """Weights stored at one precision. MoE streams route each token to `top_k` of
    `num_experts` experts; `active_params` counts what one token touches."""

    precision: str
    active_params: float
    resident_params: float
    num_experts: int = 0  # 0 = dense
    top_k: int = 0


@dataclass(frozen=True, slots=True)
class LayerClass:
    """`count` attention layers of one shape. window = 0 is full causal attention."""

    count: int
    heads: int
    head_dim: int
    kv_heads: int
    window: int = 0


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    num_layers: int
    hidden_size: int
    max_seq_len: int
    weight_streams: tuple[WeightStream, ...]
    layer_classes: tuple[LayerClass, ...]
    attention_precision: str = "bf16"
    kv_precision: str = "bf16"


# The largest request count a capacity knob may hold: counts are reported as 32-bit
# unsigned integers (engine.proto ModelCapacity).
MAX_COUNT = 2**32 - 1


@dataclass(slots=True)
class SchedulerConfig:
    """Knobs of one model's scheduler. max_num_seqs and max_waiting change live
    (both at most MAX_COUNT)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    policy: str = "fcfs"  # "fcfs" | "priority"
    enable_chunked_prefill: bool = True
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    kv_cache_capacity: int | None = None  # bytes; None = derived from HBM
    max_model_len: int | None = None  # None = the model's max_seq_len
    long_prefill_token_threshold: int = 0  # 0 = no per-request prefill cap
    max_waiting: int = 0  # 0 = unbounded: never refuse


@dataclass(frozen=True, slots=True)
class TimeCorrection:
    """t' = alpha * t + beta, applied to every step in every driver."""

    alpha: float = 1.0
    beta: float = 0.0


@dataclass(slots=True)
class Deployment:
    """One served model on one hardware preset: what a scheduler and cost model need."""

    name: str  # served model name (what clients put in "model")
    model: Model
    hardware: Hardware
    tp: int = 1
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    time_correction: TimeCorrection = field(default_factory=TimeCorrection)
    source: str = ""  # file it came from, for messages
