"""The catalog of hardware and model presets.

Knows: where the preset TOML files live (package data `engine/sim/presets/{hardware,models}`),
what keys a hardware or model table has and what values are possible, and how a precision
the hardware lacks is priced; bad input is refused through `inference_lab.common.toml`
with the file and the key path. Returns `sim.specs` dataclasses.
Does not know: deployments or schedulers (`sim.config`), workloads (`common.workload`),
nor how a step is timed (`sim.cost`).
"""

from __future__ import annotations

import tomllib
from importlib import resources
from typing import Any

from inference_lab.common.toml import REQUIRED, ConfigError, Table
from inference_lab.engine.sim.specs import BYTES_PER_VALUE, PRECISION_ORDER, Hardware, LayerClass, Model, WeightStream

__all__ = [
    "ConfigError", "hardware_names", "model_names", "load_hardware",
    "load_model", "parse_hardware", "parse_model", "compute_precision", "weight_bytes",
]


# ---- presets -------------------------------------------------------------------------

def _preset_dir(kind: str) -> Any:
    return resources.files("inference_lab.engine.sim") / "presets" / kind


def _names(kind: str) -> list[str]:
    return sorted(p.name[: -len(".toml")] for p in _preset_dir(kind).iterdir()
                  if p.name.endswith(".toml"))


def hardware_names() -> list[str]:
    return _names("hardware")


def model_names() -> list[str]:
    return _names("models")


def _preset(kind: str, name: str) -> tuple[str, dict[str, Any], str]:
    stem = name.lower() if isinstance(name, str) else ""
    known = _names(kind)
    if stem not in known:
        noun = "hardware" if kind == "hardware" else "model"
        raise ConfigError("", "", f"unknown {noun} preset {name!r}; known presets: {', '.join(known)}")
    where = f"engine/catalog/{kind}/{stem}.toml"
    text = (_preset_dir(kind) / f"{stem}.toml").read_text(encoding="utf-8")
    try:
        return stem, tomllib.loads(text), where
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(where, "", f"invalid TOML: {exc}") from None


def load_hardware(name: str) -> Hardware:
    """The hardware preset of that file stem (case-insensitive); its name is the stem."""
    stem, table, where = _preset("hardware", name)
    return parse_hardware(table, where, name=stem)


def load_model(name: str) -> Model:
    """The model preset of that file stem (case-insensitive)."""
    stem, table, where = _preset("models", name)
    return parse_model(table, where, name=stem)


# ---- parsing -------------------------------------------------------------------------

_POSITIVE = "a positive number"
_HARDWARE_KEYS = ("name", *(f"flops_{p}" for p in PRECISION_ORDER), "memory_bandwidth",
                  "memory_capacity", "fabric")
_MODEL_KEYS = ("name", "hidden_dim", "num_layers", "max_seq_len", "attention_precision",
               "weights", "layers")
_WEIGHT_KEYS = ("precision", "active_params", "resident_params", "routing")
_ROUTING_KEYS = ("routed_experts", "experts_per_tok", "moe_layers")
_LAYER_KEYS = ("kind", "count", "heads", "head_dim", "kv_heads", "window", "kv_precision")
_PRECISIONS = f"one of {', '.join(repr(p) for p in BYTES_PER_VALUE)}"


def _pos_int(t: Table, key: str, **kw: Any) -> int:
    return t.get(key, int, "an integer >= 1", ok=lambda v: v >= 1, **kw)


def _precision(t: Table, key: str, default: Any = REQUIRED) -> str:
    return t.get(key, str, _PRECISIONS, default, ok=lambda v: v in BYTES_PER_VALUE)


def parse_hardware(table: Any, where: str, path: str = "", name: str | None = None) -> Hardware:
    """A Hardware from a hardware table: `flops_<precision>` (at least one),
    `memory_bandwidth`, `memory_capacity`, `[fabric] scale_up = {bandwidth, latency}`.
    An optional `name` key names it when the caller gives no `name`."""
    t = Table(table, where, path, _HARDWARE_KEYS)
    own_name = t.get("name", str, "a string", None)
    peaks = {p: t.get(f"flops_{p}", float, _POSITIVE, None, ok=lambda v: v > 0) for p in PRECISION_ORDER}
    flops = {p: v for p, v in peaks.items() if v is not None}
    bandwidth = t.get("memory_bandwidth", float, f"{_POSITIVE} (bytes/s)", ok=lambda v: v > 0)
    capacity = t.get("memory_capacity", float, f"{_POSITIVE} (bytes)", ok=lambda v: v > 0)
    fabric = t.table("fabric", keys=("scale_up",))
    scale_up = fabric.table("scale_up", keys=("bandwidth", "latency"))
    link_bw = scale_up.get("bandwidth", float, f"{_POSITIVE} (bytes/s per direction)",
                           ok=lambda v: v > 0)
    latency = scale_up.get("latency", float, "a number >= 0 (seconds)", 5e-6, ok=lambda v: v >= 0)
    for sub in (scale_up, fabric, t):
        sub.done()
    if not flops:
        keys = ", ".join(f"flops_{p}" for p in PRECISION_ORDER)
        raise ConfigError(where, t.key("flops_bf16"), f"missing; expected at least one of {keys}")
    return Hardware(name=name or own_name or (path or where), flops=flops, hbm_bandwidth=bandwidth,
                    hbm_bytes=capacity, link_bandwidth=link_bw, link_latency=latency)


def _parse_weights(w: Table) -> WeightStream:
    precision = _precision(w, "precision")
    active = w.get("active_params", float, _POSITIVE, ok=lambda v: v > 0)
    resident = w.get("resident_params", float, f"a number >= active_params ({active:g})",
                     ok=lambda v: v >= active)
    experts = top_k = 0
    routing = w.table("routing", None, _ROUTING_KEYS)
    if routing is not None:
        experts = routing.get("routed_experts", int, "an integer >= 2", ok=lambda v: v >= 2)
        top_k = routing.get("experts_per_tok", int, f"an integer in [1, {experts - 1}]",
                            ok=lambda v: 1 <= v < experts)
        _pos_int(routing, "moe_layers", default=None)  # documentation only: not used in timing
        routing.done()
        if resident <= active:
            raise w.error("resident_params", "more resident than active params (routed)", resident)
    w.done()
    return WeightStream(precision, active, resident, experts, top_k)


def _parse_layer(layer: Table, default_kv: str) -> tuple[LayerClass, str]:
    layer.get("kind", str, "'attention'", "attention", ok=lambda v: v == "attention")
    count = _pos_int(layer, "count")
    heads = _pos_int(layer, "heads")
    head_dim = _pos_int(layer, "head_dim")
    kv_heads = layer.get("kv_heads", int, f"an integer >= 1 dividing heads ({heads})",
                         ok=lambda v: v >= 1 and heads % v == 0)
    window = layer.get("window", int, "an integer >= 0 (0 = full attention)", 0, ok=lambda v: v >= 0)
    kv_precision = _precision(layer, "kv_precision", default_kv)
    layer.done()
    return LayerClass(count, heads, head_dim, kv_heads, window), kv_precision


def parse_model(table: Any, where: str, path: str = "", name: str | None = None) -> Model:
    """A Model from a model table: `name` (else the `name` given), `hidden_dim`,
    `num_layers` (default: the sum of layer counts), `max_seq_len`, `attention_precision`,
    `[[weights]]` streams and `[[layers]]` attention classes sharing one `kv_precision`."""
    t = Table(table, where, path, _MODEL_KEYS)
    own_name = t.get("name", str, "a non-empty string", name, ok=bool)
    if own_name is None:
        raise ConfigError(where, t.key("name"), "missing; expected a non-empty string")
    hidden = _pos_int(t, "hidden_dim")
    num_layers = _pos_int(t, "num_layers", default=None)
    max_seq_len = _pos_int(t, "max_seq_len")
    attention_precision = _precision(t, "attention_precision", "bf16")
    streams = tuple(_parse_weights(w) for w in t.tables("weights", _WEIGHT_KEYS))
    layers, kv_precision = [], None
    for layer in t.tables("layers", _LAYER_KEYS):
        cls, kv = _parse_layer(layer, kv_precision or attention_precision)
        if kv_precision is not None and kv != kv_precision:
            raise layer.error("kv_precision", f"the other layers' kv_precision ({kv_precision!r})", kv)
        layers.append(cls)
        kv_precision = kv
    t.done()
    total = sum(cls.count for cls in layers)
    if num_layers is not None and num_layers < total:
        raise t.error("num_layers", f"at least the sum of layer counts ({total})", num_layers)
    return Model(name=own_name, num_layers=num_layers or total, hidden_size=hidden,
                 max_seq_len=max_seq_len, weight_streams=streams, layer_classes=tuple(layers),
                 attention_precision=attention_precision, kv_precision=kv_precision or "bf16")


# ---- derived facts -------------------------------------------------------------------

def compute_precision(hardware: Hardware, precision: str) -> str | None:
    """The precision `precision` is priced at on `hardware`: itself if the hardware has a
    peak for it, else the next wider one it has (fp4 on an H100 -> fp8); None if none."""
    for p in PRECISION_ORDER[PRECISION_ORDER.index(precision):]:
        if p in hardware.flops:
            return p
    return None


def weight_bytes(model: Model) -> float:
    """Resident weight bytes of the whole model (before tensor parallelism splits them)."""
    return sum(s.resident_params * BYTES_PER_VALUE[s.precision] for s in model.weight_streams)
