"""The catalog of hardware and model presets, bundled and the user's own.

Knows: where preset TOML files live (package data `engine/sim/presets/{hardware,models}`,
then each user catalog directory's `hardware/` and `models/`, a later one overriding an
earlier one and the bundled presets), what keys a hardware or model table has and what
values are possible, and how a precision the hardware lacks is priced; bad input is
refused through `inference_lab.common.toml` with the file and the key path. Returns
`sim.specs` dataclasses.
Does not know: deployments or schedulers (`sim.config`), workloads (`common.workload`),
nor how a step is timed (`sim.cost`, `sim.layers`).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

from inference_lab.common.toml import REQUIRED, ConfigError, Table, read_toml
from inference_lab.engine.sim.pooling import KEYS as POOLING_KEYS
from inference_lab.engine.sim.pooling import parse_pooling
from inference_lab.engine.sim.reasoning import KEYS as REASONING_KEYS
from inference_lab.engine.sim.reasoning import parse_reasoning
from inference_lab.engine.sim.specs import (
    BYTES_PER_VALUE, LAYER_KINDS, PRECISION_ORDER, Calibration, Hardware, History, LayerClass, Model,
    WeightStream,
)

__all__ = [
    "Catalog", "BUNDLED", "ConfigError", "hardware_names", "model_names", "load_hardware",
    "load_model", "parse_hardware", "parse_model", "compute_precision", "weight_bytes",
]

KINDS = ("hardware", "models")


def _bundled_dir(kind: str) -> Any:
    return resources.files("inference_lab.engine.sim") / "presets" / kind


class Catalog:
    """Presets by lower-case file stem: the bundled ones, then each of `dirs` in order
    (a later directory's file replaces an earlier one of the same name)."""

    def __init__(self, dirs: Iterable[str | Path] = ()) -> None:
        self.dirs = tuple(Path(d) for d in dirs)
        for d in self.dirs:
            if not d.is_dir():
                raise ConfigError(str(d), "", "catalog directory: no such directory "
                                  "(expected one holding models/*.toml and/or hardware/*.toml)")
        self._files: dict[str, dict[str, tuple[str, Any]]] = {}
        for kind in KINDS:
            found: dict[str, tuple[str, Any]] = {}
            for p in _bundled_dir(kind).iterdir():
                if p.name.endswith(".toml"):
                    found[p.name[:-5].lower()] = (f"engine/sim/presets/{kind}/{p.name}", p)
            for d in self.dirs:
                for p in sorted((d / kind).glob("*.toml")) if (d / kind).is_dir() else ():
                    found[p.stem.lower()] = (str(p), p)
            self._files[kind] = found

    def names(self, kind: str) -> list[str]:
        return sorted(self._files[kind])

    def hardware_names(self) -> list[str]:
        return self.names("hardware")

    def model_names(self) -> list[str]:
        return self.names("models")

    def where(self, kind: str) -> str:
        """The places a preset of `kind` is looked for, for messages."""
        return ", ".join([f"engine/sim/presets/{kind}", *(str(d / kind) for d in self.dirs)])

    def source(self, kind: str, name: str) -> str:
        """The file a preset comes from."""
        return self._files[kind][name.lower()][0]

    def text(self, kind: str, name: str) -> str:
        """The TOML text of a preset (for a copy that changes one table)."""
        self._table(kind, name)  # refuses an unknown name, listing the known ones
        return self._files[kind][name.lower()][1].read_text(encoding="utf-8")

    def _table(self, kind: str, name: str) -> tuple[str, dict[str, Any], str]:
        stem = name.lower() if isinstance(name, str) else ""
        if stem not in self._files[kind]:
            noun = "hardware" if kind == "hardware" else "model"
            raise ConfigError("", "", f"unknown {noun} preset {name!r}; known presets: "
                              f"{', '.join(self.names(kind))} (looked in {self.where(kind)})")
        where, path = self._files[kind][stem]
        if isinstance(path, Path):
            return stem, read_toml(path), where
        try:
            return stem, tomllib.loads(path.read_text(encoding="utf-8")), where
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(where, "", f"invalid TOML: {exc}") from None

    def load_hardware(self, name: str) -> Hardware:
        """The hardware preset of that file stem (case-insensitive); its name is the stem."""
        stem, table, where = self._table("hardware", name)
        return parse_hardware(table, where, name=stem)

    def load_model(self, name: str) -> Model:
        """The model preset of that file stem (case-insensitive)."""
        stem, table, where = self._table("models", name)
        return parse_model(table, where, name=stem)


BUNDLED = Catalog()


def hardware_names() -> list[str]:
    return BUNDLED.hardware_names()


def model_names() -> list[str]:
    return BUNDLED.model_names()


def load_hardware(name: str) -> Hardware:
    return BUNDLED.load_hardware(name)


def load_model(name: str) -> Model:
    return BUNDLED.load_model(name)


# ---- parsing -------------------------------------------------------------------------

_POSITIVE = "a positive number"
_HARDWARE_KEYS = ("name", *(f"flops_{p}" for p in PRECISION_ORDER), "memory_bandwidth",
                  "memory_capacity", "load_bandwidth", "host_link", "fabric", "memory", "calibration")
_CALIBRATION_KEYS = ("flops_efficiency", "moe_flops_efficiency", "flops_half_tokens", "bandwidth_efficiency",
                     "comm_efficiency", "comm_bandwidth_efficiency", "step_overhead", "request_overhead", "layer_overhead",
                     "expert_overhead", "fp4_expert_overhead", "mla_layer_overhead", "sequence_overhead",
                     "sequence_kernel_overhead", "mixed_step_overhead",
                     "prompt_token_overhead", "stream_overhead", "unoverlapped_fraction", "routing_skew", "kv_bandwidth_efficiency",
                     "memory_reserve", "fit", "transferred_from", "vllm_version", "generations")
_LINK_KEYS = ("bandwidth", "latency", "in_network_reduction")
_STORE_KEYS = ("name", "per", "kind", "capacity", "bandwidth", "stripe", "aggregate_bandwidth",
               "latency", "pin")
_MODEL_KEYS = ("name", "hidden_dim", "num_layers", "max_seq_len", "attention_precision",
               "activation_bytes", "vocab_size", "weights", "layers", "pooling", "reasoning")
_WEIGHT_KEYS = ("precision", "active_params", "resident_params", "routing", "scale_block")
_ROUTING_KEYS = ("routed_experts", "experts_per_tok", "moe_layers")
_LAYER_KEYS = {
    "attention": ("kind", "count", "heads", "head_dim", "kv_heads", "kv_shared", "window",
                  "kv_precision", "norm_all_reduces"),
    "mla": ("kind", "count", "latent_dim", "rope_dim", "kv_precision", "window", "history",
            "heads", "qk_head_dim", "v_head_dim", "q_latent_dim", "o_latent_dim"),
    "linear": ("kind", "count", "state_bytes"),
}
_HISTORY_KEYS = ("compress_ratio", "index_topk", "indexer")
_INDEXER_KEYS = ("heads", "head_dim", "kv_precision", "precision")
_PRECISIONS = f"one of {', '.join(repr(p) for p in BYTES_PER_VALUE)}"


def _pos_int(t: Table, key: str, **kw: Any) -> int:
    return t.get(key, int, "an integer >= 1", ok=lambda v: v >= 1, **kw)


def _nonneg_int(t: Table, key: str, what: str = "an integer >= 0", default: Any = 0) -> int:
    return t.get(key, int, what, default, ok=lambda v: v >= 0)


def _precision(t: Table, key: str, default: Any = REQUIRED) -> str:
    return t.get(key, str, _PRECISIONS, default, ok=lambda v: v in BYTES_PER_VALUE)


def _link(t: Table | None, what: str) -> tuple[float, float, bool]:
    if t is None:
        return 0.0, 0.0, False
    bw = t.get("bandwidth", float, f"{_POSITIVE} ({what} bytes/s per direction)", ok=lambda v: v > 0)
    latency = t.get("latency", float, "a number >= 0 (seconds)", 5e-6, ok=lambda v: v >= 0)
    reduce = t.get("in_network_reduction", bool, "true or false", False)
    t.done()
    return bw, latency, reduce


def _parse_memory(t: Table) -> tuple[tuple[str, ...], tuple[tuple[str, str, float], ...], int]:
    """The hardware's KV stores beyond HBM, checked for shape: their names, each one's
    (name, per, capacity in bytes per instance or 0) and the GPUs a node's stores serve
    (0: not given). Their links and policies are kept by shape only."""
    per_node = _nonneg_int(t, "gpus_per_node", "an integer >= 1", None) or 0
    names, capacities = [], []
    per = "'gpu', 'node' or 'cluster'"
    for s in t.tables("stores", _STORE_KEYS) if "stores" in t.data else ():
        names.append(s.get("name", str, "a non-empty string", ok=bool))
        where = s.get("per", str, per, ok=lambda v: v in ("gpu", "node", "cluster"))
        s.get("kind", str, "'store' or 'peer_hbm'", "store", ok=lambda v: v in ("store", "peer_hbm"))
        capacity = s.get("capacity", float, f"{_POSITIVE}", None, ok=lambda v: v > 0)
        capacities.append((names[-1], where, float(capacity or 0.0)))
        for key in ("bandwidth", "aggregate_bandwidth"):
            s.get(key, float, f"{_POSITIVE}", None, ok=lambda v: v > 0)
        s.get("latency", float, "a number >= 0 (seconds)", 0.0, ok=lambda v: v >= 0)
        _pos_int(s, "stripe", default=1)
        s.get("pin", bool, "true or false", False)
        s.done()
    for j in t.tables("junctions", ("name", "per")) if "junctions" in t.data else ():
        j.get("name", str, "a non-empty string", ok=bool)
        j.get("per", str, per, ok=lambda v: v in ("gpu", "node", "cluster"))
        j.done()
    for link in t.tables("links", ("name", "from", "to", "bandwidth", "latency")) if "links" in t.data else ():
        for key in ("name", "from", "to"):
            link.get(key, str, "a non-empty string", ok=bool)
        link.get("bandwidth", float, f"{_POSITIVE} (bytes/s)", ok=lambda v: v > 0)
        link.get("latency", float, "a number >= 0 (seconds)", 0.0, ok=lambda v: v >= 0)
        link.done()
    t.get("stores", list, "an array of tables", None)
    t.get("junctions", list, "an array of tables", None)
    t.get("links", list, "an array of tables", None)
    t.done()
    return tuple(names), tuple(capacities), per_node


def parse_hardware(table: Any, where: str, path: str = "", name: str | None = None) -> Hardware:
    """A Hardware from a hardware table: `flops_<precision>` (at least one),
    `memory_bandwidth`, `memory_capacity`, optional `load_bandwidth` (bytes/s), `host_link`
    ({bandwidth, latency}: KV offloading's link to host memory), `[fabric]` (`gpus_per_node`,
    `scale_up` and `scale_out` = {bandwidth, latency, in_network_reduction}) and `[memory]`
    (stores, junctions, links: parsed, not simulated). An optional `name` key names it
    when the caller gives no `name`."""
    t = Table(table, where, path, _HARDWARE_KEYS)
    own_name = t.get("name", str, "a string", None)
    peaks = {p: t.get(f"flops_{p}", float, _POSITIVE, None, ok=lambda v: v > 0) for p in PRECISION_ORDER}
    flops = {p: v for p, v in peaks.items() if v is not None}
    bandwidth = t.get("memory_bandwidth", float, f"{_POSITIVE} (bytes/s)", ok=lambda v: v > 0)
    capacity = t.get("memory_capacity", float, f"{_POSITIVE} (bytes)", ok=lambda v: v > 0)
    load = t.get("load_bandwidth", float, f"{_POSITIVE} (bytes/s)", 64e9, ok=lambda v: v > 0)
    host = t.table("host_link", None, ("bandwidth", "latency"))
    host_bw, host_latency = 0.0, -1.0
    if host is not None:  # KV offloading's link to host memory (engine.sim.offload)
        host_bw = host.get("bandwidth", float, f"{_POSITIVE} (bytes/s per direction)", ok=lambda v: v > 0)
        host_latency = host.get("latency", float, "a number >= 0 (seconds per transfer)", 5e-5,
                                ok=lambda v: v >= 0)
        host.done()
    fabric = t.table("fabric", None, ("gpus_per_node", "scale_up", "scale_out"))
    link_bw, latency, reduce, per_node, out_bw, out_latency = 0.0, 5e-6, False, 0, 0.0, 0.0
    if fabric is not None:
        per_node = _nonneg_int(fabric, "gpus_per_node", "an integer >= 1", 0)
        link_bw, latency, reduce = _link(fabric.table("scale_up", keys=_LINK_KEYS), "scale-up")
        out_bw, out_latency, _ = _link(fabric.table("scale_out", None, _LINK_KEYS), "scale-out")
        fabric.done()
    memory = t.table("memory", None)
    stores, capacities, store_nodes = _parse_memory(memory) if memory is not None else ((), (), 0)
    cal = t.table("calibration", None, _CALIBRATION_KEYS)
    generations = _parse_generations(cal.table("generations", None)) if cal is not None else ()
    calibration = _parse_calibration(cal) if cal is not None else None
    t.done()
    if not flops:
        keys = ", ".join(f"flops_{p}" for p in PRECISION_ORDER)
        raise ConfigError(where, t.key("flops_bf16"), f"missing; expected at least one of {keys}")
    return Hardware(name=name or own_name or (path or where), flops=flops, hbm_bandwidth=bandwidth,
                    hbm_bytes=capacity, link_bandwidth=link_bw, link_latency=latency,
                    in_network_reduction=reduce, gpus_per_node=per_node,
                    scale_out_bandwidth=out_bw, scale_out_latency=out_latency,
                    memory_stores=stores, store_capacities=capacities,
                    store_gpus_per_node=store_nodes, calibration=calibration,
                    generations=generations,
                    load_bandwidth=load, host_link_bandwidth=host_bw,
                    host_link_latency=host_latency)


def _parse_calibration(t: Table) -> Calibration:
    """The `[calibration]` table: the calibrated timing model's fitted parameters."""
    fraction = "a number in (0, 1]"
    c = Calibration(
        flops_efficiency=t.get("flops_efficiency", float, fraction, 1.0, ok=lambda v: 0 < v <= 1),
        moe_flops_efficiency=t.get("moe_flops_efficiency", float,
                                   "a number in [0, 1] (0: as flops_efficiency)", 0.0,
                                   ok=lambda v: 0 <= v <= 1),
        flops_half_tokens=t.get("flops_half_tokens", float, "a number >= 0 (tokens)", 0.0,
                                ok=lambda v: v >= 0),
        bandwidth_efficiency=t.get("bandwidth_efficiency", float, fraction, 1.0,
                                   ok=lambda v: 0 < v <= 1),
        comm_efficiency=t.get("comm_efficiency", float, fraction, 1.0, ok=lambda v: 0 < v <= 1),
        comm_bandwidth_efficiency=t.get("comm_bandwidth_efficiency", float,
                                        "a number in [0, 1] (0: as comm_efficiency)", 0.0,
                                        ok=lambda v: 0 <= v <= 1),
        step_overhead=t.get("step_overhead", float, "a number >= 0 (seconds)", 0.0, ok=lambda v: v >= 0),
        request_overhead=t.get("request_overhead", float, "a number >= 0 (seconds)", 0.0,
                               ok=lambda v: v >= 0),
        layer_overhead=t.get("layer_overhead", float, "a number >= 0 (seconds)", 0.0,
                             ok=lambda v: v >= 0),
        expert_overhead=t.get("expert_overhead", float, "a number >= 0 (seconds)", 0.0,
                              ok=lambda v: v >= 0),
        fp4_expert_overhead=t.get("fp4_expert_overhead", float,
                                  "a number >= 0 (seconds; absent: as expert_overhead)", None,
                                  ok=lambda v: v >= 0),
        mla_layer_overhead=t.get("mla_layer_overhead", float, "a number >= 0 (seconds)", 0.0,
                                 ok=lambda v: v >= 0),
        sequence_overhead=t.get("sequence_overhead", float, "a number >= 0 (seconds)", 0.0,
                                ok=lambda v: v >= 0),
        sequence_kernel_overhead=t.get("sequence_kernel_overhead", float, "a number >= 0 (seconds)",
                                       0.0, ok=lambda v: v >= 0),
        mixed_step_overhead=t.get("mixed_step_overhead", float, "a number >= 0 (seconds)", 0.0,
                                  ok=lambda v: v >= 0),
        prompt_token_overhead=t.get("prompt_token_overhead", float, "a number >= 0 (seconds)", 0.0,
                                    ok=lambda v: v >= 0),
        stream_overhead=t.get("stream_overhead", float, "a number >= 0 (seconds)", 0.0,
                              ok=lambda v: v >= 0),
        unoverlapped_fraction=t.get("unoverlapped_fraction", float, "a number in [0, 1]", 0.0,
                                    ok=lambda v: 0 <= v <= 1),
        routing_skew=t.get("routing_skew", float, "a number >= 0 (Zipf exponent)", 0.0,
                           ok=lambda v: v >= 0),
        kv_bandwidth_efficiency=t.get("kv_bandwidth_efficiency", float,
                                      "a number in [0, 1] (0: as bandwidth_efficiency)", 0.0,
                                      ok=lambda v: 0 <= v <= 1),
        memory_reserve=t.get("memory_reserve", float, "a number >= 0 (bytes per GPU)", 0.0,
                             ok=lambda v: v >= 0),
        fit=t.get("fit", str, "a string", ""),
        transferred_from=t.get("transferred_from", str, "a hardware preset name", ""),
        vllm_version=t.get("vllm_version", str, "a vLLM release such as \"0.11\"", "",
                           ok=lambda v: bool(_VERSION.fullmatch(v))))
    t.done()
    return c


_VERSION = re.compile(r"\d+(?:\.\d+)*")


def _parse_generations(t: Table | None) -> tuple[Calibration, ...]:
    """`[calibration.generations."0.22"]`: the fits of other vLLM generations, each a
    full calibration table named by its release (engine.sim.generations)."""
    if t is None:
        return ()
    out = []
    for version in t.data:
        if not _VERSION.fullmatch(version):
            raise t.error(version, 'a vLLM release such as "0.22" as the table\'s name', version)
        keys = tuple(k for k in _CALIBRATION_KEYS if k != "generations")
        out.append(replace(_parse_calibration(t.table(version, keys=keys)), vllm_version=version))
    t.done()
    return tuple(out)


def _parse_weights(w: Table) -> WeightStream:
    precision = _precision(w, "precision")
    active = w.get("active_params", float, _POSITIVE, ok=lambda v: v > 0)
    resident = w.get("resident_params", float, f"a number >= active_params ({active:g})",
                     ok=lambda v: v >= active)
    experts = top_k = moe_layers = 0
    routing = w.table("routing", None, _ROUTING_KEYS)
    if routing is not None:
        experts = routing.get("routed_experts", int, "an integer >= 2", ok=lambda v: v >= 2)
        top_k = routing.get("experts_per_tok", int, f"an integer in [1, {experts - 1}]",
                            ok=lambda v: 1 <= v < experts)
        moe_layers = _pos_int(routing, "moe_layers", default=0)
        routing.done()
        if resident <= active:
            raise w.error("resident_params", "more resident than active params (routed)", resident)
    scale_block = _pos_int(w, "scale_block", default=0)
    w.done()
    return WeightStream(precision, active, resident, experts, top_k, moe_layers, scale_block)


def _parse_history(h: Table, attention_precision: str) -> History:
    ratio = _pos_int(h, "compress_ratio", default=1)
    topk = _nonneg_int(h, "index_topk", "an integer >= 0 (0 = every entry)")
    indexer = h.table("indexer", None, _INDEXER_KEYS)
    heads = head_dim = 0
    kv, precision = "bf16", ""
    if indexer is not None:
        heads = _pos_int(indexer, "heads")
        head_dim = _pos_int(indexer, "head_dim")
        kv = _precision(indexer, "kv_precision", attention_precision)
        precision = _precision(indexer, "precision", attention_precision)
        indexer.done()
    h.done()
    return History(ratio, topk, heads, head_dim, kv, precision)


def _parse_layer(layer: Table, default_kv: str, attention_precision: str) -> LayerClass:
    kind = layer.get("kind", str, " or ".join(repr(k) for k in LAYER_KINDS), "attention",
                     ok=lambda v: v in LAYER_KINDS)
    layer.refuse_unknown(_LAYER_KEYS[kind])
    count = _pos_int(layer, "count")
    if kind == "linear":
        state = layer.get("state_bytes", float, f"{_POSITIVE} (bytes per sequence per layer)",
                          ok=lambda v: v > 0)
        layer.done()
        return LayerClass(count, kind=kind, state_bytes=state)
    window = layer.get("window", int, "an integer >= 0 (0 = full attention)", 0, ok=lambda v: v >= 0)
    kv_precision = _precision(layer, "kv_precision", default_kv)
    if kind == "attention":
        heads = _pos_int(layer, "heads")
        head_dim = _pos_int(layer, "head_dim")
        kv_heads = layer.get("kv_heads", int, f"an integer >= 1 dividing heads ({heads})",
                             ok=lambda v: v >= 1 and heads % v == 0)
        shared = layer.get("kv_shared", bool, "true or false", False)
        norm_all_reduces = _nonneg_int(layer, "norm_all_reduces")
        layer.done()
        return LayerClass(count, heads, head_dim, kv_heads, window, kind=kind,
                          kv_precision=kv_precision, kv_shared=shared,
                          norm_all_reduces=norm_all_reduces)
    latent = _pos_int(layer, "latent_dim")
    rope = _nonneg_int(layer, "rope_dim")
    shape = {key: _nonneg_int(layer, key, "an integer >= 1", 0)
             for key in ("heads", "qk_head_dim", "v_head_dim", "q_latent_dim", "o_latent_dim")}
    given = [key for key in ("heads", "qk_head_dim", "v_head_dim") if shape[key]]
    if given and len(given) != 3:
        missing = next(key for key in ("heads", "qk_head_dim", "v_head_dim") if not shape[key])
        raise ConfigError(layer.where, layer.key(missing),
                          "missing; expected heads, qk_head_dim and v_head_dim all or none")
    if given and shape["qk_head_dim"] < rope:
        raise layer.error("qk_head_dim", f"at least rope_dim ({rope})", shape["qk_head_dim"])
    h = layer.table("history", None, _HISTORY_KEYS)
    history = _parse_history(h, attention_precision) if h is not None else None
    layer.done()
    return LayerClass(count, shape["heads"], 0, 0, window, kind=kind, kv_precision=kv_precision,
                      latent_dim=latent, rope_dim=rope, qk_head_dim=shape["qk_head_dim"],
                      v_head_dim=shape["v_head_dim"], q_latent_dim=shape["q_latent_dim"],
                      o_latent_dim=shape["o_latent_dim"], history=history)


def parse_model(table: Any, where: str, path: str = "", name: str | None = None) -> Model:
    """A Model from a model table: `name` (else the `name` given), `hidden_dim`,
    `num_layers` (default: the sum of layer counts), `max_seq_len`, `attention_precision`,
    `activation_bytes`, `vocab_size` (the LM head's rows, optional), `[[weights]]` streams and `[[layers]]` classes of kind
    attention, mla or linear, and for a pooling model its `[pooling]` table (sim.pooling),
    for a reasoning model its `[reasoning]` table (sim.reasoning)."""
    t = Table(table, where, path, _MODEL_KEYS)
    own_name = t.get("name", str, "a non-empty string", name, ok=bool)
    if own_name is None:
        raise ConfigError(where, t.key("name"), "missing; expected a non-empty string")
    hidden = _pos_int(t, "hidden_dim")
    num_layers = _pos_int(t, "num_layers", default=None)
    max_seq_len = _pos_int(t, "max_seq_len")
    attention_precision = _precision(t, "attention_precision", "bf16")
    activation_bytes = _pos_int(t, "activation_bytes", default=2)
    vocab_size = _pos_int(t, "vocab_size", default=0)
    streams = tuple(_parse_weights(w) for w in t.tables("weights", _WEIGHT_KEYS))
    layers = [_parse_layer(layer, attention_precision, attention_precision)
              for layer in t.tables("layers")]
    pooling_table = t.table("pooling", None, POOLING_KEYS)
    pooling = parse_pooling(pooling_table, hidden) if pooling_table is not None else None
    reasoning_table = t.table("reasoning", None, REASONING_KEYS)
    reasoning = parse_reasoning(reasoning_table) if reasoning_table is not None else None
    t.done()
    if all(cls.kind == "linear" for cls in layers):
        raise ConfigError(where, t.key("layers"), "expected at least one attention or mla layer "
                          "(a model of linear layers only has no KV cache to page)")
    total = sum(cls.count for cls in layers)
    if num_layers is not None and num_layers < total:
        raise t.error("num_layers", f"at least the sum of layer counts ({total})", num_layers)
    kv_precision = next(cls.kv_precision for cls in layers if cls.kind != "linear")
    return Model(name=own_name, num_layers=num_layers or total, hidden_size=hidden,
                 max_seq_len=max_seq_len, weight_streams=streams, layer_classes=tuple(layers),
                 attention_precision=attention_precision, kv_precision=kv_precision,
                 activation_bytes=activation_bytes, vocab_size=vocab_size, pooling=pooling,
                 reasoning=reasoning)


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
    return sum(s.resident_params * s.bytes_per_value for s in model.weight_streams)
