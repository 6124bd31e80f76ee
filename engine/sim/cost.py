"""Roofline step timing: how long one engine iteration takes on the modelled hardware.

Knows the deployment's hardware, model and tensor-parallel degree. Does not know about
requests or scheduling: callers describe a batch by its token count and its attention
load, already summed over requests (so a batch of 256 decodes costs the same Python work
as a batch of 1). What each layer kind costs per position is engine.sim.layers'.

Per precision stream p:  t_p = max(FLOPs_p / (rate_p * tp), bytes_p / (bw * tp)).
Streams are summed; tensor parallelism adds two collectives per layer; the deployment's
time_correction maps t to alpha * t + beta. The calibrated model adds achieved fractions,
kernel floors per layer and per touched expert, a router that favours some experts, math
and memory that overlap only in part, and charges the LM head per sequence.
docs/timing.md has the formulas.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from inference_lab.engine.sim import layers
from inference_lab.engine.sim.specs import PRECISION_ORDER, Deployment, Hardware

log = logging.getLogger(__name__)

NORM_STAT_BYTES = 8.0  # per token of a norm's all-reduce: two fp32 statistics (q and k)


@dataclass(frozen=True, slots=True)
class StepCost:
    """The time of one iteration, what bounded its largest stream, and the time its
    FLOPs and its bytes would take at the peak rates (summed over the streams; their
    shares of the step are inference-lab's `flops_util` and `bandwidth_util`)."""

    seconds: float
    bound: str  # "compute" or "memory"
    compute_seconds: float = 0.0
    memory_seconds: float = 0.0
    # the step's work per GPU (vLLM's --enable-mfu-metrics estimates): its FLOPs, the
    # bytes it reads (weights, KV, recurrent states) and writes (the new positions' KV,
    # the states), from the same terms as the time (docs/timing.md)
    flops: float = 0.0
    read_bytes: float = 0.0
    write_bytes: float = 0.0


@dataclass(frozen=True, slots=True)
class AttentionLoad:
    """Attention work of a batch, summed over its requests, per reach `cap` of the
    model (CostModel.caps order; cap 0 = the whole context).

    For a request with n new positions and c computed ones, m = c + ceil(n/2) and
    a = min(m, cap) (a = m for cap 0):
      decodes (n = `decode_width` each):  decode_p[j]  = sum a
      prefill chunks:                     prefill_np[j] = sum n * a,  prefill_p[j] = sum a
    `sequences` counts the requests of the step (recurrent states are read per sequence).
    """

    decode_p: tuple[float, ...] = ()
    prefill_np: tuple[float, ...] = ()
    prefill_p: tuple[float, ...] = ()
    decode_width: int = 1
    sequences: int = 0


def rate_for(hardware: Hardware, precision: str) -> tuple[float, str]:
    """The FLOP rate a precision runs at, and the precision actually used: a precision
    the hardware lacks is priced at the next wider one it has."""
    start = PRECISION_ORDER.index(precision)
    for candidate in PRECISION_ORDER[start:]:
        rate = hardware.flops.get(candidate)
        if rate:
            return rate, candidate
    raise ValueError(f"hardware {hardware.name} has no FLOP rate for {precision} or wider")


def expected_distinct_experts(num_experts: int, top_k: int, tokens: int, skew: float = 0.0) -> float:
    """Experts touched by T tokens, each routed to k distinct ones. Uniform routing (skew
    0): E * (1 - (1 - k/E)^T) (an expert escapes one token with probability 1 - k/E).
    A router that favours some experts (skew s > 0): the e-th most popular expert is
    chosen by a token with probability q_e = min(1, k * e^-s / sum_j j^-s) and touched
    with probability 1 - (1 - q_e)^T, so a step reaches fewer of them at a given T and
    approaches all E more slowly."""
    if not skew:
        return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)
    weights = [i ** -skew for i in range(1, num_experts + 1)]
    scale = top_k / sum(weights)
    return sum(1.0 - (1.0 - min(1.0, w * scale)) ** tokens for w in weights)


def all_reduce_seconds(hw: Hardware, group: int, nbytes: float) -> float:
    """One all-reduce of `nbytes` over `group` GPUs. In a node: latency + f * V / bw with
    f = 1 when the switch reduces, else 2 (g - 1) / g (ring). Across nodes: reduce inside
    each node, all-reduce the node's V / gpus_per_node shard over the NICs (ring over the
    nodes), gather inside the node again."""
    if group <= 1:
        return 0.0
    per_node = hw.gpus_per_node or group
    g = min(group, per_node)
    f = 1.0 if hw.in_network_reduction else 2.0 * (g - 1) / g
    inside = hw.link_latency + f * nbytes / hw.link_bandwidth
    if group <= per_node:
        return inside
    nodes = -(-group // per_node)
    shard = nbytes / per_node
    across = hw.scale_out_latency + 2.0 * (nodes - 1) / nodes * shard / hw.scale_out_bandwidth
    return inside + across


class CostModel:
    """Step time of one deployment. Build once; `step_cost` is the hot call."""

    def __init__(self, deployment: Deployment) -> None:
        hw, model, tp = deployment.hardware, deployment.model, deployment.tp
        self.deployment = deployment
        self.tp = tp
        self.bandwidth = hw.hbm_bandwidth * tp
        self.alpha = deployment.time_correction.alpha
        self.beta = deployment.time_correction.beta
        # The calibrated model (docs/timing.md): achieved fractions of the peaks, a FLOP
        # efficiency that ramps with the step's tokens, fixed costs per step and request.
        cal = hw.calibration if deployment.timing == "calibrated" else None
        self.calibrated = cal is not None
        self._flops_eff = cal.flops_efficiency if cal else 1.0
        self._moe_flops_eff = cal.resolved("moe_flops_efficiency") if cal else 1.0
        self._flops_half = cal.flops_half_tokens if cal else 0.0
        self._step_overhead = cal.step_overhead if cal else 0.0
        self._mixed_overhead = cal.mixed_step_overhead if cal else 0.0
        self._unoverlapped = cal.unoverlapped_fraction if cal else 0.0
        self._routing_skew = cal.routing_skew if cal else 0.0
        if cal:  # kernel floors: every layer and every MLA layer, every step (docs/timing.md)
            mla = sum(c.count for c in model.layer_classes if c.kind == "mla")
            self._step_overhead += model.num_layers * cal.layer_overhead + mla * cal.mla_layer_overhead
        # per sequence: host work, plus GPU work split over the TP group
        self._sequence_overhead = cal.sequence_overhead + cal.sequence_kernel_overhead / tp if cal else 0.0
        expert_floor = cal.expert_overhead / deployment.ep if cal else 0.0
        # 4-bit experts (MXFP4, NVFP4) run other kernels, with a floor of their own when set
        fp4_floor = cal.resolved("fp4_expert_overhead") / deployment.ep if cal else 0.0
        self.request_overhead = cal.request_overhead if cal else 0.0
        self.prompt_token_overhead = cal.prompt_token_overhead if cal else 0.0
        self.stream_overhead = cal.stream_overhead if cal else 0.0
        comm = cal.comm_efficiency if cal else 1.0
        comm_bytes = cal.resolved("comm_bandwidth_efficiency") if cal else 1.0
        # KV reads at their own fraction of the peak (the decode attention kernels'), as
        # extra seconds per KV byte beside the weights' rate; 0 when not set
        self._kv_extra = 0.0
        if cal:
            self.bandwidth *= cal.bandwidth_efficiency
            if cal.kv_bandwidth_efficiency:
                self._kv_extra = (1.0 / cal.kv_bandwidth_efficiency
                                  - 1.0 / cal.bandwidth_efficiency) / (hw.hbm_bandwidth * tp)

        warned: set[str] = set()

        def rate(precision: str) -> float:
            value, used = rate_for(hw, precision)
            if used != precision and precision not in warned:
                warned.add(precision)
                log.info("%s on %s: no %s rate, %s is priced at %s",
                         deployment.name, hw.name, precision, precision, used)
            return value * tp

        # Weight streams grouped by precision (docs/timing.md sums FLOPs and bytes per
        # precision before the max): precision -> [rate, 2*active of dense streams, dense
        # bytes, MoE parts, 2*active of MoE streams] where each MoE part is (E, k, bytes per
        # expert). MoE FLOPs are kept apart: the calibrated model runs them at their own
        # efficiency (the roofline at the same peak, so the sum is the roofline's).
        groups: dict[str, list] = {}

        def group_of(precision: str) -> list:
            return groups.setdefault(precision, [rate(precision), 0.0, 0.0, [], 0.0])

        # Calibrated: the LM head (vocab x hidden, in the last dense stream) computes
        # logits for the one position of each sequence that samples, not for every
        # position of a prefill: its FLOPs move from per token to per sequence.
        head = float(model.vocab_size * model.hidden_size) if cal else 0.0
        head_stream = max((i for i, s in enumerate(model.weight_streams) if not s.num_experts),
                          default=None)
        if head_stream is None or model.weight_streams[head_stream].active_params < head:
            head = 0.0
        self._head_flops = 2.0 * head
        expert_floors: list[tuple[int, int, float]] = []  # (E, k, seconds per touched expert)
        for index, stream in enumerate(model.weight_streams):
            group = group_of(stream.precision)
            bpv = stream.bytes_per_value
            if stream.num_experts:
                group[4] += 2.0 * stream.active_params
            else:
                group[1] += 2.0 * (stream.active_params - (head if index == head_stream else 0.0))
            if stream.num_experts:
                e, k = stream.num_experts, stream.top_k
                w = (stream.resident_params - stream.active_params) / (e - k)
                group[2] += max(stream.active_params - k * w, 0.0) * bpv  # shared part
                group[3].append((e, k, w * bpv))
                floor = fp4_floor if stream.precision == "fp4" else expert_floor
                if floor:
                    expert_floors.append((e, k, floor * stream.moe_layers))
            else:
                group[2] += stream.active_params * bpv
        group_of(model.attention_precision)
        self._expert_floors = tuple(expert_floors)
        self._head_index = (list(groups).index(model.weight_streams[head_stream].precision)
                            if head else -1)

        # Attention paths by reach: cap -> per stream [decode, prefill, prefill/attended]
        # FLOP coefficients, and the bytes read per attended position (charged to the
        # attention stream, where the KV reads happen).
        # KV reads at the cache's precision (--kv-cache-dtype); FLOPs are unchanged.
        cached = layers.with_kv_cache_dtype(model, deployment.scheduler.kv_cache_dtype)
        all_terms = layers.terms(cached, tp)
        self._kv_write = layers.kv_write_bytes_per_token(cached, tp)  # per GPU and position
        for term in all_terms:
            group_of(term.precision)
        names = list(groups)
        self.caps: tuple[int, ...] = (0, *sorted({t.cap for t in all_terms if t.cap}))
        self.windows = self.caps[1:]  # the decode group's per-window sums
        flop = [[[0.0, 0.0, 0.0] for _ in names] for _ in self.caps]
        read = [0.0] * len(self.caps)
        for term in all_terms:
            j = self.caps.index(term.cap)
            coef = flop[j][names.index(term.precision)]
            coef[0] += term.scale * term.decode_flops
            coef[1] += term.scale * term.prefill_flops
            coef[2] += term.scale * term.prefill_flops_per_attended
            read[j] += term.scale * term.read_bytes
        self._flop_coefs = tuple(tuple(tuple(c) for c in row) for row in flop)
        self._read_coefs = tuple(read)
        self._state_bytes = layers.state_bytes_per_step(model)  # read and written: half each
        self._streams = [(g[0], g[1], g[2], tuple(g[3]), g[4]) for g in groups.values()]
        self._attention_index = names.index(model.attention_precision)

        # Collectives: one all-reduce after each token-mixing layer and one after each FFN
        # (dense or routed; a model may have FFN-only layers, so max(layers, moe_layers)),
        # each of T * hidden * activation_bytes over the TP group. Experts sharded over
        # `ep` ranks are combined by the same FFN all-reduce (attention is tensor-parallel).
        ffn = max(model.num_layers, model.moe_layers)
        self._collectives = model.num_layers + ffn if tp > 1 else 0
        # The fixed latency at comm_efficiency, the token bytes at comm_bandwidth_efficiency
        # (0: the same fraction).
        latency = all_reduce_seconds(hw, tp, 0.0)
        self._ar_latency = latency / comm
        self._ar_per_token = (all_reduce_seconds(hw, tp, float(model.hidden_size * model.activation_bytes))
                              - latency) / comm_bytes if tp > 1 else 0.0
        # Norms over all heads (split by TP) all-reduce their statistics: NORM_STAT_BYTES
        # per token each (MiniMax-M2's QK norm: the fp32 variances of q and k).
        self._norm_collectives = sum(c.count * c.norm_all_reduces for c in model.layer_classes) if tp > 1 else 0
        self._norm_ar_per_token = ((all_reduce_seconds(hw, tp, NORM_STAT_BYTES) - latency) / comm_bytes
                                   if self._norm_collectives else 0.0)
        self._distinct_cache: dict[tuple[int, int], float] = {}

    def _moe_bytes(self, parts: tuple[tuple[int, int, float], ...], tokens: int) -> float:
        """Expert bytes read by a step of `tokens` tokens (cached by token count)."""
        cache = self._distinct_cache
        key = (id(parts), tokens)
        value = cache.get(key)
        if value is None:
            value = sum(expected_distinct_experts(e, k, tokens, self._routing_skew) * per_expert
                        for e, k, per_expert in parts)
            if len(cache) < 65536:
                cache[key] = value
        return value

    def _expert_floor(self, tokens: int) -> float:
        """Kernel floor of the experts a step of `tokens` tokens touches (cached)."""
        cache = self._distinct_cache
        key = (-1, tokens)
        value = cache.get(key)
        if value is None:
            value = sum(expected_distinct_experts(e, k, tokens, self._routing_skew) * seconds
                        for e, k, seconds in self._expert_floors)
            if len(cache) < 65536:
                cache[key] = value
        return value

    def step_cost(self, tokens: int, load: AttentionLoad) -> StepCost:
        """The cost of one iteration computing `tokens` new positions."""
        nstreams = len(self._streams)
        attn_flops = [0.0] * nstreams
        if self._head_flops:
            attn_flops[self._head_index] = self._head_flops * (load.sequences or tokens)
        attn_bytes = self._state_bytes * load.sequences
        width = load.decode_width
        dec, pnp, pp = load.decode_p, load.prefill_np, load.prefill_p
        for j, row in enumerate(self._flop_coefs):
            d = dec[j] if dec else 0.0
            n = pnp[j] if pnp else 0.0
            p = pp[j] if pp else 0.0
            if not (d or p):
                continue
            for i, (cd, cp, cu) in enumerate(row):
                attn_flops[i] += cd * width * d + cp * n + cu * p
            attn_bytes += self._read_coefs[j] * (d + p)
        seconds = self._step_overhead + self._sequence_overhead * load.sequences
        if self._mixed_overhead and pp and pp[0]:  # a step that carries prefill chunks
            seconds += self._mixed_overhead
        if self._expert_floors:
            seconds += self._expert_floor(tokens)
        worst = 0.0
        bound = "memory"
        busy_compute = busy_memory = 0.0
        total_flops = total_bytes = 0.0
        bandwidth = self.bandwidth
        ramp = tokens / (tokens + self._flops_half) if self.calibrated else 1.0
        eff = self._flops_eff * ramp
        moe_eff = self._moe_flops_eff * ramp
        for i, (rate, flops_per_token, dense_bytes, moe, moe_flops_per_token) in enumerate(self._streams):
            flops = flops_per_token * tokens + attn_flops[i]
            nbytes = dense_bytes + self._moe_bytes(moe, tokens) if moe else dense_bytes
            t_memory = 0.0
            if i == self._attention_index:
                nbytes += attn_bytes
                if self._kv_extra:
                    t_memory = (attn_bytes - self._state_bytes * load.sequences) * self._kv_extra
            t_compute = flops / (rate * eff)
            if moe_flops_per_token:
                moe_flops = moe_flops_per_token * tokens
                t_compute += moe_flops / (rate * moe_eff)
                flops += moe_flops
            total_flops += flops
            total_bytes += nbytes
            t_memory += nbytes / bandwidth
            busy_compute += t_compute
            busy_memory += t_memory
            if t_compute > t_memory:
                t = t_compute + self._unoverlapped * t_memory
            else:
                t = t_memory + self._unoverlapped * t_compute
            if t > worst:
                worst = t
                bound = "compute" if t_compute > t_memory else "memory"
            seconds += t
        if self._collectives:
            seconds += self._collectives * (self._ar_latency + tokens * self._ar_per_token)
        if self._norm_collectives:
            seconds += self._norm_collectives * (self._ar_latency + tokens * self._norm_ar_per_token)
        # Per GPU (the totals are the TP group's): the roofline's bytes are reads, but for
        # the recurrent states' written half; writes add the new positions' KV.
        tp = self.tp
        state_write = 0.5 * self._state_bytes * load.sequences
        return StepCost(self.alpha * seconds + self.beta, bound, busy_compute, busy_memory,
                        total_flops / tp, (total_bytes - state_write) / tp,
                        self._kv_write * tokens + state_write / tp)


def _reach(m: float, cap: int) -> float:
    return m if not cap or m < cap else cap


def attention_load(caps: tuple[int, ...], chunks, decode: tuple[float, ...] = (),
                   decode_width: int = 1, decodes: int = 0) -> AttentionLoad:
    """The AttentionLoad of prefill `chunks`, (new positions n, computed positions c)
    pairs, plus the decode sums per cap as the decode group returns them."""
    pnp = [0.0] * len(caps)
    pp = [0.0] * len(caps)
    count = 0
    for n, c in chunks:
        count += 1
        m = c + (n + 1) // 2  # c + ceil(n / 2)
        for j, cap in enumerate(caps):
            a = _reach(m, cap)
            pnp[j] += n * a
            pp[j] += a
    return AttentionLoad(tuple(decode), tuple(pnp), tuple(pp), decode_width, decodes + count)


def decode_sums(caps: tuple[int, ...], contexts) -> tuple[float, ...]:
    """Per-cap sums of the attended positions of decodes with `contexts` computed
    positions each (m = c + 1): what the decode group keeps incrementally."""
    return tuple(sum(_reach(c + 1, cap) for c in contexts) for cap in caps)
