"""Roofline step timing: how long one engine iteration takes on the modelled hardware.

Knows the deployment's hardware, model and tensor-parallel degree. Does not know about
requests or scheduling: callers describe a batch by its token count and its attention
load, already summed over requests (so a batch of 256 decodes costs the same Python work
as a batch of 1).

Per precision stream p:  t_p = max(FLOPs_p / (rate_p * tp), bytes_p / (bw * tp)).
Streams are summed; tensor parallelism adds two all-reduces per layer; the deployment's
time_correction maps t to alpha * t + beta.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from inference_lab.engine.sim.specs import BYTES_PER_VALUE, PRECISION_ORDER, Deployment, Hardware

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StepCost:
    """The time of one iteration and what bounded its largest stream."""

    seconds: float
    bound: str  # "compute" or "memory"
    flops: float
    bytes: float


@dataclass(frozen=True, slots=True)
class AttentionLoad:
    """Attention work of a batch, summed over its requests.

    For request i with n_i new positions and mean causal context m_i = c_i + ceil(n_i/2):
      full_np  = sum n_i * m_i        full_p  = sum m_i
      win_np[j] = sum n_i * min(m_i, W_j)   win_p[j] = sum min(m_i, W_j)
    for each distinct sliding window W_j of the model (CostModel.windows order).
    """

    full_np: float = 0.0
    full_p: float = 0.0
    win_np: tuple[float, ...] = ()
    win_p: tuple[float, ...] = ()


def rate_for(hardware: Hardware, precision: str) -> tuple[float, str]:
    """The FLOP rate a precision runs at, and the precision actually used: a precision
    the hardware lacks is priced at the next wider one it has."""
    start = PRECISION_ORDER.index(precision)
    for candidate in PRECISION_ORDER[start:]:
        rate = hardware.flops.get(candidate)
        if rate:
            return rate, candidate
    raise ValueError(f"hardware {hardware.name} has no FLOP rate for {precision} or wider")


def expected_distinct_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """E * (1 - (1 - 1/E)^(T*k)): experts touched by T tokens routed uniformly."""
    return num_experts * (1.0 - (1.0 - 1.0 / num_experts) ** (tokens * top_k))


class CostModel:
    """Step time of one deployment. Build once; `step_seconds` is the hot call."""

    def __init__(self, deployment: Deployment) -> None:
        hw, model, tp = deployment.hardware, deployment.model, deployment.tp
        self.deployment = deployment
        self.tp = tp
        self.bandwidth = hw.hbm_bandwidth * tp
        self.alpha = deployment.time_correction.alpha
        self.beta = deployment.time_correction.beta

        warned: set[str] = set()

        def rate(precision: str) -> float:
            value, used = rate_for(hw, precision)
            if used != precision and precision not in warned:
                warned.add(precision)
                log.info("%s on %s: no %s rate, %s is priced at %s",
                         deployment.name, hw.name, precision, precision, used)
            return value * tp

        # Weight streams grouped by precision (docs/timing.md sums FLOPs and bytes per
        # precision before the max): precision -> [rate, 2*active, dense bytes, MoE parts]
        # where each MoE part is (E, k, bytes per expert).
        groups: dict[str, list] = {}
        for stream in model.weight_streams:
            group = groups.setdefault(stream.precision, [rate(stream.precision), 0.0, 0.0, []])
            bpv = BYTES_PER_VALUE[stream.precision]
            group[1] += 2.0 * stream.active_params
            if stream.num_experts:
                e, k = stream.num_experts, stream.top_k
                w = (stream.resident_params - stream.active_params) / (e - k)
                group[2] += max(stream.active_params - k * w, 0.0) * bpv  # shared part
                group[3].append((e, k, w * bpv))
            else:
                group[2] += stream.active_params * bpv
        if model.attention_precision not in groups:  # attention at a precision no weight uses
            groups[model.attention_precision] = [rate(model.attention_precision), 0.0, 0.0, []]
        self._streams = [(g[0], g[1], g[2], tuple(g[3])) for g in groups.values()]
        self._attention_index = list(groups).index(model.attention_precision)

        kv_bytes = BYTES_PER_VALUE[model.kv_precision]
        self.full_flop_coef = 0.0  # FLOPs per (new position x attended position)
        self.full_byte_coef = 0.0  # KV bytes read per attended position
        windows: dict[int, list[float]] = {}
        for layer in model.layer_classes:
            flop = layer.count * 4.0 * layer.heads * layer.head_dim
            byte = layer.count * 2.0 * layer.kv_heads * layer.head_dim * kv_bytes
            if layer.window:
                coef = windows.setdefault(layer.window, [0.0, 0.0])
                coef[0] += flop
                coef[1] += byte
            else:
                self.full_flop_coef += flop
                self.full_byte_coef += byte
        self.windows: tuple[int, ...] = tuple(sorted(windows))
        self._win_coefs = tuple((windows[w][0], windows[w][1]) for w in self.windows)

        # Tensor-parallel collectives: two all-reduces per layer, in-switch reduction.
        self._ar_count = 2 * model.num_layers if tp > 1 else 0
        self._ar_latency = hw.link_latency
        self._ar_bytes_per_token = model.hidden_size * 2.0 / hw.link_bandwidth
        self._distinct_cache: dict[tuple[int, int], float] = {}

    def _moe_bytes(self, parts: tuple[tuple[int, int, float], ...], tokens: int) -> float:
        """Expert bytes read by a step of `tokens` tokens (cached by token count)."""
        cache = self._distinct_cache
        key = (id(parts), tokens)
        value = cache.get(key)
        if value is None:
            value = sum(expected_distinct_experts(e, k, tokens) * per_expert
                        for e, k, per_expert in parts)
            if len(cache) < 65536:
                cache[key] = value
        return value

    def step_cost(self, tokens: int, attn: AttentionLoad) -> StepCost:
        """The cost of one iteration computing `tokens` new positions."""
        return self._combine(tokens, attn.full_np, attn.full_p, attn.win_np, attn.win_p)

    def step_cost_raw(self, tokens: int, full_np: float, full_p: float,
                      win_np, win_p) -> tuple[float, str]:
        """(seconds, bound) of an iteration given the AttentionLoad sums (hot path)."""
        cost = self._combine(tokens, full_np, full_p, win_np, win_p)
        return cost.seconds, cost.bound

    def _combine(self, tokens: int, full_np: float, full_p: float, win_np, win_p) -> StepCost:
        attn_flops = self.full_flop_coef * full_np
        attn_bytes = self.full_byte_coef * full_p
        for (flop, byte), np_, p in zip(self._win_coefs, win_np, win_p):
            attn_flops += flop * np_
            attn_bytes += byte * p
        seconds = 0.0
        worst = 0.0
        bound = "memory"
        total_flops = 0.0
        total_bytes = 0.0
        bandwidth = self.bandwidth
        for i, (rate, flops_per_token, dense_bytes, moe) in enumerate(self._streams):
            flops = flops_per_token * tokens
            nbytes = dense_bytes + self._moe_bytes(moe, tokens) if moe else dense_bytes
            if i == self._attention_index:
                flops += attn_flops
                nbytes += attn_bytes
            t_compute = flops / rate
            t_memory = nbytes / bandwidth
            t = t_compute if t_compute > t_memory else t_memory
            if t > worst:
                worst = t
                bound = "compute" if t_compute > t_memory else "memory"
            seconds += t
            total_flops += flops
            total_bytes += nbytes
        if self._ar_count:
            seconds += self._ar_count * (self._ar_latency + tokens * self._ar_bytes_per_token)
        return StepCost(self.alpha * seconds + self.beta, bound, total_flops, total_bytes)


def attention_sums(windows: tuple[int, ...], pairs, full: float = 0.0,
                   wins: tuple[float, ...] | None = None):
    """Add the reference formula's sums for explicit (new positions n, computed
    positions c) pairs to a starting load (full, wins) where n = 1 for all, as the
    decode group returns it. Returns (full_np, full_p, win_np, win_p)."""
    full_np = full_p = full
    win_np = list(wins) if wins is not None else [0.0] * len(windows)
    win_p = list(win_np)
    for n, c in pairs:
        m = c + (n + 1) // 2  # c + ceil(n / 2)
        full_np += n * m
        full_p += m
        for j, w in enumerate(windows):
            a = m if m < w else w
            win_np[j] += n * a
            win_p[j] += a
    return full_np, full_p, win_np, win_p


def attention_load_of(windows: tuple[int, ...], requests: list[tuple[int, int]]) -> AttentionLoad:
    """AttentionLoad of explicit (new positions n, computed positions c) pairs."""
    full_np, full_p, win_np, win_p = attention_sums(windows, requests)
    return AttentionLoad(full_np, full_p, tuple(win_np), tuple(win_p))
