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
# vLLM's --kv-cache-dtype values -> the precision the cache is stored at ("auto": each
# layer's own kv_precision, the model's dtype). vLLM spells bf16 "bfloat16" and fp8
# "fp8_e4m3" / "fp8_e5m2" too: both spellings are taken.
KV_CACHE_DTYPES: dict[str, str] = {"auto": "", "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16",
                                   "float16": "fp16", "fp8": "fp8", "fp8_e4m3": "fp8",
                                   "fp8_e5m2": "fp8"}


@dataclass(frozen=True, slots=True)
class Calibration:
    """The `calibrated` timing model's parameters for one GPU (engine.sim.cost):
    achieved FLOP rate = peak x flops_efficiency x T / (T + flops_half_tokens) for a step
    of T tokens, with moe_flops_efficiency in place of flops_efficiency for the MoE
    streams' FLOPs (grouped GEMMs over many small expert slices); achieved bandwidth = peak x bandwidth_efficiency; collectives take
    1 / comm_efficiency as long (their bytes 1 / comm_bandwidth_efficiency as long when that
    is set: an all-reduce of a few megabytes of prefill tokens reaches less of the fabric's
    bandwidth than its fixed latency suggests); every step pays step_overhead seconds (scheduling,
    sampling, launches); a request reaches the scheduler request_overhead seconds after
    it arrives (tokenisation and admission, which run beside the GPU: TTFT only).
    Kernel floors: every layer adds layer_overhead seconds per step (the minimum time of
    its chain of small kernels, which a launch graph does not remove), every MLA layer
    mla_layer_overhead more (its longer chain: latent projections and norms, rope, the
    absorbed up-projections, cache write, the MLA kernel and its metadata), and
    every expert a step touches expert_overhead per MoE layer (the ramp-up and tail of
    its small weight read and the padding of its token block), on each GPU: per touched
    expert / ep; experts stored at 4 bits (MXFP4, NVFP4), whose kernels differ, pay
    fp4_expert_overhead instead when it is set. Host work grows with the batch: sequence_overhead seconds per sequence
    in the step (input preparation, sampling, detokenisation, output processing), and
    sequence_kernel_overhead seconds of GPU work per sequence in the step that the
    roofline does not price (the fixed work of its attention, logits and sampling
    kernels), split over the tensor-parallel GPUs like the heads it runs on; and a
    request reaches the scheduler prompt_token_overhead seconds per prompt token later
    still (tokenising and preparing its prompt on the host), and stream_overhead seconds
    per request already in the engine (running or waiting) when it arrives: the API
    server takes a new request in between detokenising and streaming the others' tokens,
    so under many streams it reaches the scheduler later (TTFT only). A step that carries prefill
    tokens (a mixed step) pays mixed_step_overhead seconds more: the attention backends'
    prefill path beside the decode path, its per-step planning and metadata. A stream's math
    and memory traffic overlap only in part: unoverlapped_fraction of the shorter of the
    two adds to the longer (kernels far below their FLOP peak do not hide their weight
    reads). The KV cache a step attends is read at kv_bandwidth_efficiency of the HBM
    peak (0: as the weights). The routed experts a step touches follow routing_skew, the Zipf exponent of
    their popularity (0: uniform routing; larger: fewer touched at a middling batch). The
    LM head is charged once per sequence in the step (the position that
    samples), not per position (needs the model's vocab_size). Memory: each GPU keeps
    memory_reserve bytes outside the weights and the KV pool (what vLLM's memory profile
    sets aside: the activation peak of its largest step and the sampler's, communication
    buffers and kernel workspaces), so the pool holds that much less (engine.sim.kv)."""

    flops_efficiency: float = 1.0  # fraction of peak FLOP/s at large steps
    flops_half_tokens: float = 0.0  # tokens per step at which half of that is reached
    moe_flops_efficiency: float = 0.0  # the same for routed-expert GEMMs (0: flops_efficiency)
    bandwidth_efficiency: float = 1.0  # fraction of peak HBM bandwidth
    comm_efficiency: float = 1.0  # fraction of the fabric's collective speed
    # fraction of the fabric's bandwidth the collectives reach on the step's token bytes
    # (0: comm_efficiency, which then prices their latency and bytes alike)
    comm_bandwidth_efficiency: float = 0.0
    step_overhead: float = 0.0  # seconds per step outside the kernels
    request_overhead: float = 0.0  # seconds from arrival to schedulable
    layer_overhead: float = 0.0  # seconds per layer per step (kernel floor)
    expert_overhead: float = 0.0  # seconds per touched expert per MoE layer per step
    fp4_expert_overhead: float | None = None  # the same for 4-bit experts (None: expert_overhead)
    mla_layer_overhead: float = 0.0  # seconds per MLA layer per step (its longer kernel chain)
    sequence_overhead: float = 0.0  # seconds per sequence in the step (host work)
    sequence_kernel_overhead: float = 0.0  # GPU seconds per sequence in the step, / tp
    prompt_token_overhead: float = 0.0  # seconds per prompt token before schedulable (host)
    stream_overhead: float = 0.0  # seconds per request in the engine before schedulable (host)
    mixed_step_overhead: float = 0.0  # seconds more for a step that carries prefill tokens
    # share of the shorter of a stream's math and memory times not hidden under the longer
    # (0: the roofline's max; 1: they add)
    unoverlapped_fraction: float = 0.0
    # Zipf exponent of the routed experts' popularity (0: uniform routing)
    routing_skew: float = 0.0
    # fraction of the HBM peak the decode attention kernels reach on the KV cache they
    # read (0: bandwidth_efficiency, as the weights)
    kv_bandwidth_efficiency: float = 0.0
    # bytes per GPU kept outside the weights and the KV pool (activation peak, buffers)
    memory_reserve: float = 0.0
    fit: str = ""  # where the numbers come from
    # "" when fitted on this GPU; else the preset whose fit was carried over by rule
    # (fractions of peak and fixed time costs unchanged: docs/timing.md)
    transferred_from: str = ""
    # the vLLM release whose measurements the fit imitates ("0.11"; "" unstated;
    # engine.sim.generations)
    vllm_version: str = ""

    @property
    def provenance(self) -> str:
        """'fitted', or 'transferred from <hardware>'."""
        return f"transferred from {self.transferred_from}" if self.transferred_from else "fitted"

    def resolved(self, name: str) -> float:
        """The value key `name` takes effect with: a key of AS_ANOTHER_KEY left at its unset
        value stands for the other key's."""
        value = getattr(self, name)
        other = AS_ANOTHER_KEY.get(name)
        if other is not None and value == other[1]:
            return getattr(self, other[0])
        return value


# The [calibration] keys whose unset value means "as another key": key -> (that key, the
# unset value). 0 is the unset value of the fractions; a 4-bit expert floor of 0 is a
# floor of nothing, so its unset value is None (absent from the table).
AS_ANOTHER_KEY: dict[str, tuple[str, float | None]] = {
    "moe_flops_efficiency": ("flops_efficiency", 0.0),
    "comm_bandwidth_efficiency": ("comm_efficiency", 0.0),
    "kv_bandwidth_efficiency": ("bandwidth_efficiency", 0.0),
    "fp4_expert_overhead": ("expert_overhead", None),
}


@dataclass(frozen=True, slots=True)
class Hardware:
    """One GPU: dense tensor-core peaks (no sparsity), HBM and the collective fabric.

    A group of up to `gpus_per_node` GPUs talks over the scale-up fabric (NVLink /
    NVSwitch / Infinity Fabric); a wider one also crosses the scale-out NICs."""

    name: str
    flops: dict[str, float]  # precision -> FLOP/s per GPU
    hbm_bandwidth: float  # bytes/s per GPU
    hbm_bytes: float  # bytes per GPU
    link_bandwidth: float  # scale-up bytes/s per direction per GPU
    link_latency: float = 5e-6  # seconds per collective
    in_network_reduction: bool = False  # the switch reduces (NVLink SHARP): no ring factor
    gpus_per_node: int = 0  # 0 = any group fits one scale-up domain
    scale_out_bandwidth: float = 0.0  # bytes/s per direction per GPU across nodes; 0 = none
    scale_out_latency: float = 0.0
    memory_stores: tuple[str, ...] = ()  # KV tiers beyond HBM the node offers, by name
    # each store's (name, per "gpu" | "node" | "cluster", bytes per instance; 0: none given)
    # and the GPUs a node's stores serve (0: the fabric's): what KV offloading can map
    # onto its host and disk tiers (engine.sim.offload.memory_tiers)
    store_capacities: tuple[tuple[str, str, float], ...] = ()
    store_gpus_per_node: int = 0
    calibration: Calibration | None = None  # the `calibrated` timing model's fit
    # fits of other vLLM generations (`--timing calibrated-v0.22`: engine.sim.generations)
    generations: tuple[Calibration, ...] = ()
    # bytes/s per GPU at which weights load from the host at start-up (the host link's peak;
    # engine.fleet.startup): PCIe Gen5 x16 unless the preset says otherwise
    load_bandwidth: float = 64e9
    # the GPU's link to host memory per direction, for KV offloading (engine.sim.offload):
    # bytes/s per GPU (0: PCIe Gen5 x16's effective rate) and seconds per transfer job
    host_link_bandwidth: float = 0.0
    host_link_latency: float = -1.0


@dataclass(frozen=True, slots=True)
class WeightStream:
    """Weights stored at one precision. MoE streams route each token to `top_k` of
    `num_experts` experts; `active_params` counts what one token touches. Microscaled
    formats store a 1-byte scale per `scale_block` values beside them (NVFP4: an FP8
    scale per 16; MXFP4: an E8M0 scale per 32), read and held with the weights."""

    precision: str
    active_params: float
    resident_params: float
    num_experts: int = 0  # 0 = dense
    top_k: int = 0
    moe_layers: int = 0  # layers with a routed FFN (0 = dense stream)
    scale_block: int = 0  # values sharing one 1-byte block scale (NVFP4 16, MXFP4 32); 0 = none

    @property
    def bytes_per_value(self) -> float:
        """Bytes one stored weight takes: its precision's, plus its share of a block scale
        (NVFP4: 0.5 + 1/16 = 0.5625)."""
        return BYTES_PER_VALUE[self.precision] + (1.0 / self.scale_block if self.scale_block else 0.0)


@dataclass(frozen=True, slots=True)
class History:
    """An MLA layer's long-range path: the context at stride `compress_ratio`, all of
    it or the `index_topk` entries an indexer (its own small keys) selects."""

    compress_ratio: int = 1
    index_topk: int = 0  # 0 = attend every compressed entry
    indexer_heads: int = 0  # 0 = no indexer
    indexer_head_dim: int = 0
    indexer_kv_precision: str = "bf16"
    indexer_precision: str = ""  # "" = the model's attention precision


LAYER_KINDS = ("attention", "mla", "linear")


@dataclass(frozen=True, slots=True)
class LayerClass:
    """`count` token-mixing layers of one shape (engine.sim.layers prices each kind).

    attention: GQA/MHA, `heads` x `head_dim` queries, `kv_heads` KV heads (K and V one
      tensor when `kv_shared`); `window` > 0 attends only the last `window` positions.
    mla: multi-head latent attention, a cache of `latent_dim + rope_dim` values per
      position shared by all heads; `qk_head_dim`/`v_head_dim` the per-head shapes
      (0 = unknown: 4 x hidden FLOPs per pair); optional `history` path.
    linear: recurrent state of `state_bytes` per sequence, no growth with context.
    `norm_all_reduces`: all-reduces of a few fp32 statistics per token each layer adds
    under tensor parallelism (a norm over all heads, whose heads are split: MiniMax-M2's
    QK norm sums the variances of q and k over the TP group, 2 values per token)."""

    count: int
    heads: int = 0
    head_dim: int = 0
    kv_heads: int = 0
    window: int = 0
    kind: str = "attention"
    kv_precision: str = "bf16"
    kv_shared: bool = False
    latent_dim: int = 0
    rope_dim: int = 0
    qk_head_dim: int = 0
    v_head_dim: int = 0
    q_latent_dim: int = 0
    o_latent_dim: int = 0
    history: History | None = None
    state_bytes: float = 0.0
    norm_all_reduces: int = 0


POOLING_TASKS = ("embed", "score")  # vLLM's tasks of a pooling runner that the lab serves


@dataclass(frozen=True, slots=True)
class Pooling:
    """What a pooling model (vLLM's `--runner pooling`) returns instead of tokens.

    embed: one vector of `dimensions` values per input (`normalize`: unit length);
      `matryoshka` allows fewer dimensions on request (`matryoshka_dimensions`: only
      those; empty = any from 1 up). score: a cross-encoder, one score per (query,
      document) pair, in [0, 1] after its sigmoid. `pooling_type` (CLS, LAST, MEAN) and
      `bidirectional` (an encoder) describe the model; the cost of a request is its
      prefill whatever they are (engine.sim.core: a pooling request generates nothing)."""

    task: str = "embed"
    dimensions: int = 0  # embed: the vector's length (the hidden size, unless projected)
    normalize: bool = True
    matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] = ()
    pooling_type: str = "LAST"
    bidirectional: bool = False


@dataclass(frozen=True, slots=True)
class Reasoning:
    """A reasoning model (vLLM's `--reasoning-parser`): each reply's first tokens are its
    reasoning, `share` of them unless the request says otherwise; `parser` names vLLM's
    parser of the model (openai_gptoss, deepseek_r1, ...), for display."""

    parser: str
    share: float = 0.5


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    num_layers: int
    hidden_size: int
    max_seq_len: int
    weight_streams: tuple[WeightStream, ...]
    layer_classes: tuple[LayerClass, ...]
    attention_precision: str = "bf16"
    kv_precision: str = "bf16"  # of the first cache-holding layer (for display)
    activation_bytes: int = 2  # bytes per activation element on the wire
    vocab_size: int = 0  # the LM head's rows (0 = unknown); it is in the last dense stream
    pooling: Pooling | None = None  # a pooling model (embeddings, scores); None = generative
    reasoning: Reasoning | None = None  # a reasoning model; None = no reasoning output

    @property
    def moe_layers(self) -> int:
        """Layers whose FFN is routed (the rest have a dense FFN)."""
        return max((s.moe_layers for s in self.weight_streams), default=0)


# The largest request count a capacity knob may hold: counts are reported as 32-bit
# unsigned integers (engine.proto ModelCapacity).
MAX_COUNT = 2**32 - 1


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Knobs of one model's scheduler, as configured. max_num_seqs and max_waiting are
    where the live capacity starts (EngineCore.capacity; engine.sim.capacity)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    policy: str = "fcfs"  # "fcfs" | "priority"
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True  # vLLM's default: on
    block_size: int = 16
    kv_cache_dtype: str = "auto"  # a KV_CACHE_DTYPES key: what the paged cache stores
    gpu_memory_utilization: float = 0.9
    kv_cache_capacity: int | None = None  # bytes; None = derived from HBM
    max_model_len: int | None = None  # None = the model's max_seq_len
    long_prefill_token_threshold: int = 0  # 0 = no per-request prefill cap
    max_waiting: int = 0  # 0 = unbounded: never refuse
    engine: str = "vllm"  # the engine profile (engine.sim.profiles): "vllm" | "sglang"


@dataclass(frozen=True, slots=True)
class TimeCorrection:
    """t' = alpha * t + beta, applied to every step in every driver."""

    alpha: float = 1.0
    beta: float = 0.0


@dataclass(frozen=True, slots=True)
class Drafter:
    """What producing a draft costs (engine.sim.speculative prices it).

    fraction: `frac` x draft length x the verify step; autoregressive: one pass per draft
    token over `dense_params` plus a small MoE (`expert_params` per expert, `num_experts`
    routed, `experts_per_tok`, `shared_experts`); block_parallel: one pass over `params`
    for a fixed block of `block` positions."""

    kind: str = "fraction"  # fraction | autoregressive | block_parallel
    frac: float = 0.0
    dense_params: float = 0.0
    expert_params: float = 0.0
    num_experts: int = 0
    experts_per_tok: int = 0
    shared_experts: int = 0
    params: float = 0.0
    block: int = 0


@dataclass(frozen=True, slots=True)
class Speculative:
    """Speculative decoding: each decode verifies 1 + g positions and advances by
    1 + accepted. `expected[g]` is E[accepted draft tokens] at draft length g
    (g = 0..gamma, expected[0] = 0). policy "fixed" drafts `gamma`; "goodput_budget"
    picks, each step, the g that maximises (1 + expected[g]) / step time."""

    gamma: int
    expected: tuple[float, ...]
    policy: str = "fixed"
    drafter: Drafter = field(default_factory=Drafter)


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
    ep: int = 1  # expert-parallel ranks (divides tp); experts priced as balanced
    speculative: Speculative | None = None
    unmodelled: tuple[str, ...] = ()  # features parsed but not simulated, by name
    timing: str = "roofline"  # "roofline" | "calibrated" (hardware.calibration, a generation's once chosen)
    pd: object = None  # [pd]: a disaggregated layout for `sim` (engine.sim.kv_transfer.PdLayout)
    offload: object = None  # KV offloading (engine.sim.offload.OffloadConfig); None: off
