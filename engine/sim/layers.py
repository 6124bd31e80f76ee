"""What each kind of token-mixing layer costs: cache bytes, attention FLOPs, reads.

Knows the three layer kinds of the catalog (`specs.LayerClass`) and how tensor
parallelism splits or replicates their caches. Turns a model into
- `terms(model, tp)`: attention paths, each attending `scale * min(m, cap)` positions at
  mean causal context m (cap 0 = all m), with FLOPs per (new x attended) position for
  decode and prefill, prefill FLOPs per attended position (MLA's latent up-projection)
  and bytes read per attended position summed over the TP group;
- `paged_bytes_per_token`, `fixed_bytes_per_sequence`, `state_bytes_per_step`: the
  KV cache per GPU that grows with context, what a running sequence holds regardless
  of its length, and the recurrent state a step reads and writes per sequence;
  `kv_write_bytes_per_token`: the cache bytes a new position writes per GPU.
Does not know batches, time or the hardware (engine.sim.cost combines these).
`with_kv_cache_dtype` gives the model as a deployment's cache stores it (vLLM's
--kv-cache-dtype): every attention and MLA layer's cache at that precision, so the bytes
per position, the pool's capacity and the bytes a step reads all follow it.

The arithmetic, per layer (b = bytes per cached value):
- attention (GQA/MHA): KV per position 2 * kv_heads * head_dim * b (half when K and V
  share one tensor); per GPU ceil(kv_heads / tp) heads, because a KV head is never split
  (fewer KV heads than GPUs means replicas). FLOPs per pair 4 * heads * head_dim.
- mla: cache per position (latent_dim + rope_dim) * b, the same on every TP GPU
  (replicated: the latent is shared by all heads). Decode runs absorbed (DeepSeek-V2
  paper, section 2.1.3): scores against latent+rope and values in latent space,
  2 * heads * (2 * latent + rope) FLOPs per pair. Prefill runs the full heads,
  2 * heads * (qk_head_dim + v_head_dim) per pair, after up-projecting each attended
  latent to keys and values: 2 * latent * heads * (qk_head_dim - rope + v_head_dim)
  FLOPs per attended position. A layer whose qk_head_dim is latent + rope is already
  absorbed in both phases; one without a head shape is priced at 4 * hidden per pair.
  A `history` path attends the context at stride r (all of it, or the index_topk
  entries its indexer picks); the indexer scores every strided entry against its own
  keys (indexer_head_dim values per entry) at 2 * heads * head_dim FLOPs per pair.
  `window` > 0 adds a local window (without a history, window 0 = full context).
- linear: `state_bytes` per sequence, split over TP (heads split), read and written
  every step the sequence runs; no growth with context and no attention.
Paged (block-counted) bytes are those that grow with context: full-context layers and
strided histories. Windows are a small fixed amount per request and are not paged (an
all-windowed model pages its windows instead); recurrent states are fixed per sequence
and count against the KV pool as whole blocks while the sequence runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from inference_lab.engine.sim.specs import BYTES_PER_VALUE, KV_CACHE_DTYPES, LayerClass, Model


@dataclass(frozen=True, slots=True)
class Term:
    """One attention path of one layer class, summed over its `count` layers."""

    cap: int  # attended positions are scale * min(m, cap); 0 = scale * m
    scale: float
    precision: str  # the FLOP rate its matmuls run at
    decode_flops: float  # per (new position x attended position) in a decode
    prefill_flops: float  # per (new position x attended position) in a prefill chunk
    prefill_flops_per_attended: float  # per request and attended position, prefill only
    read_bytes: float  # per attended position, over the TP group (per GPU x tp)


def with_kv_cache_dtype(model: Model, kv_cache_dtype: str) -> Model:
    """`model` with its attention and MLA caches stored as `kv_cache_dtype` ("auto":
    unchanged). An MLA indexer keeps its own key precision (its cache is separate)."""
    precision = KV_CACHE_DTYPES[kv_cache_dtype]
    if not precision or all(c.kv_precision == precision for c in model.layer_classes
                            if c.kind != "linear"):
        return model
    classes = tuple(c if c.kind == "linear" else replace(c, kv_precision=precision)
                    for c in model.layer_classes)
    return replace(model, layer_classes=classes, kv_precision=precision)


def _kv_heads_per_gpu(layer: LayerClass, tp: int) -> int:
    return -(-layer.kv_heads // tp)


def attention_kv_bytes(layer: LayerClass, tp: int = 1) -> float:
    """KV bytes per cached position of one GQA layer on one of `tp` GPUs."""
    b = BYTES_PER_VALUE[layer.kv_precision]
    per_head = layer.head_dim * b * (1 if layer.kv_shared else 2)
    return _kv_heads_per_gpu(layer, tp) * per_head


def mla_kv_bytes(layer: LayerClass) -> float:
    """Latent cache bytes per position of one MLA layer (the same on every GPU)."""
    return (layer.latent_dim + layer.rope_dim) * BYTES_PER_VALUE[layer.kv_precision]


def indexer_kv_bytes(layer: LayerClass) -> float:
    h = layer.history
    if h is None or not h.indexer_heads:
        return 0.0
    return h.indexer_head_dim * BYTES_PER_VALUE[h.indexer_kv_precision]


def mla_flops(layer: LayerClass, hidden: int) -> tuple[float, float, float]:
    """(decode FLOPs per pair, prefill FLOPs per pair, prefill FLOPs per attended
    position) of one MLA layer."""
    heads, latent, rope = layer.heads, layer.latent_dim, layer.rope_dim
    if not heads:
        return 4.0 * hidden, 4.0 * hidden, 0.0
    decode = 2.0 * heads * (2 * latent + rope)
    if layer.qk_head_dim == latent + rope:  # written in its absorbed shape
        return decode, decode, 0.0
    prefill = 2.0 * heads * (layer.qk_head_dim + layer.v_head_dim)
    up = 2.0 * latent * heads * (layer.qk_head_dim - rope + layer.v_head_dim)
    return decode, prefill, up


def _windowed(layer: LayerClass) -> bool:
    """True when the layer's only reach is a local window (a fixed per-request cache)."""
    return layer.kind != "linear" and layer.window > 0 and layer.history is None


def terms(model: Model, tp: int) -> list[Term]:
    out: list[Term] = []
    attn = model.attention_precision
    for layer in model.layer_classes:
        n = layer.count
        if layer.kind == "attention":
            flops = n * 4.0 * layer.heads * layer.head_dim
            out.append(Term(layer.window, 1.0, attn, flops, flops, 0.0,
                            n * attention_kv_bytes(layer, tp) * tp))
        elif layer.kind == "mla":
            dec, pre, up = mla_flops(layer, model.hidden_size)
            read = n * mla_kv_bytes(layer) * tp
            h = layer.history
            if h is None or layer.window:  # the local window (or, alone, the whole context)
                out.append(Term(layer.window, 1.0, attn, n * dec, n * pre, n * up, read))
            if h is not None:
                r = h.compress_ratio
                out.append(Term(r * h.index_topk, 1.0 / r, attn, n * dec, n * pre, n * up, read))
                if h.indexer_heads:
                    score = n * 2.0 * h.indexer_heads * h.indexer_head_dim
                    out.append(Term(0, 1.0 / r, h.indexer_precision or attn, score, score, 0.0,
                                    n * indexer_kv_bytes(layer) * tp))
    return out


def paged_bytes_per_token(model: Model, tp: int = 1) -> float:
    """KV bytes per GPU one cached position adds (the block-counted pool)."""
    def paged(include_windows: bool) -> float:
        total = 0.0
        for layer in model.layer_classes:
            if layer.kind == "linear" or (_windowed(layer) and not include_windows):
                continue
            if layer.kind == "attention":
                total += layer.count * attention_kv_bytes(layer, tp)
            elif layer.history is not None:
                r = layer.history.compress_ratio
                total += layer.count * (mla_kv_bytes(layer) + indexer_kv_bytes(layer)) / r
            else:
                total += layer.count * mla_kv_bytes(layer)
        return total

    return paged(False) or paged(True)


def fixed_bytes_per_sequence(model: Model, tp: int = 1) -> float:
    """Bytes per GPU a running sequence holds whatever its length (recurrent states)."""
    return sum(layer.count * layer.state_bytes for layer in model.layer_classes
               if layer.kind == "linear") / tp


def state_bytes_per_step(model: Model) -> float:
    """Recurrent-state bytes one sequence reads and writes per step, over the TP group."""
    return 2.0 * sum(layer.count * layer.state_bytes for layer in model.layer_classes
                     if layer.kind == "linear")


def kv_write_bytes_per_token(model: Model, tp: int = 1) -> float:
    """Cache bytes one new position writes on one of `tp` GPUs, every layer that caches
    (windowed ones too: their ring is written as well): GQA its ceil(kv_heads / tp)
    heads, MLA its latent (replicated, on every GPU), a strided history (latent and
    indexer keys) 1 / r of an entry per position. Linear layers' states are per
    sequence (`state_bytes_per_step`)."""
    total = 0.0
    for layer in model.layer_classes:
        if layer.kind == "attention":
            total += layer.count * attention_kv_bytes(layer, tp)
        elif layer.kind == "mla":
            h = layer.history
            if h is None or layer.window:  # the whole context, or the local window
                total += layer.count * mla_kv_bytes(layer)
            if h is not None:
                total += layer.count * (mla_kv_bytes(layer) + indexer_kv_bytes(layer)) / h.compress_ratio
    return total


def kv_bytes_per_token(model: Model) -> float:
    """Cache bytes one position adds on a single GPU (tp = 1), for listings."""
    return paged_bytes_per_token(model, 1)
