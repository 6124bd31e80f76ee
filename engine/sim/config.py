"""Deployment configs: one TOML file per served model, one entry per GPU it can run on.

Knows inference-lab's deployment layout:

    name = "served-name"           # optional; default: the file stem
    model = "gpt-oss-20b"          # a catalog preset, or an inline [model] table
    [scheduler]                    # the fields of engine.specs.SchedulerConfig
    max_num_seqs = 256
    [speculative]                  # optional: speculative decoding (engine.sim.speculative)
    [hardware.b200]                # a hardware preset, or any name with `spec`
    tp = 1                         # optional, default 1; ep (divides tp) likewise
    spec = "b200"                  # optional: another preset, or an inline hardware table
    scheduler = { max_num_seqs = 64 }            # optional, merged over [scheduler]
    speculative = { ... }                        # optional, replaces [speculative]
    time_correction = { alpha = 1.0, beta = 0.0 }  # optional
    [fault]                        # optional: the gateway's (gateway.faults.config)
    [pd]                           # optional: `sim` runs it disaggregated (prefill, decode,
                                   # link, policy: engine.sim.kv_transfer.PdLayout)

plus the tables it parses but does not simulate ([router], [decode_router], [memory]'s
policies (its host-memory and NVMe tiers are KV offloading's: engine.sim.offload.memory_tiers),
[fault], `replicas`, `dp_attention`, scheduler policies beyond fcfs/priority ...): each
one is listed by name in `Deployment.unmodelled` and logged once at load.
Refuses, with the file and the key path, unknown keys, wrong types and impossible
values (weights that do not fit included), so that a bad config never starts a server.
Does not know how a step is timed or how the KV pool is laid out (cost, kv modules).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from inference_lab.common.toml import ConfigError, Table, read_toml
from inference_lab.engine.sim import catalog as bundled
from inference_lab.engine.sim import generations
from inference_lab.engine.sim import kv
from inference_lab.engine.sim.capacity import EXPECTED, out_of_range, seqs_fit_budget
from inference_lab.engine.sim.catalog import Catalog
from inference_lab.engine.sim.kv_transfer import PD_POLICIES, PdLayout, link_preset
from inference_lab.engine.sim.offload.memory_tiers import offload_from_tiers
from inference_lab.engine.sim.profiles import PROFILES
from inference_lab.engine.sim.profiles import apply as apply_profile
from inference_lab.engine.sim.specs import (
    KV_CACHE_DTYPES, Deployment, Hardware, Model, SchedulerConfig, TimeCorrection,
)
from inference_lab.engine.sim.speculative import parse_speculative

__all__ = ["ConfigError", "load_deployment", "load_config_dir", "default_deployments"]

logger = logging.getLogger(__name__)

POLICIES = ("fcfs", "priority")
# Orders inference-lab also accepts (shortest/longest input, output, total first):
# parsed, scheduled as fcfs.
OTHER_POLICIES = ("sif", "lif", "sof", "lof", "stf", "ltf", "sjf")

_TOP_KEYS = ("name", "model", "scheduler", "hardware", "speculative", "router", "decode_router",
             "memory", "fault", "pd")
_ENTRY_KEYS = ("tp", "ep", "dp_attention", "replicas", "spec", "scheduler", "speculative",
               "router", "decode_router", "memory", "time_correction", "timing")
_ROUTER_KEYS = ("policy", "max_load_ratio", "load_weight")
_ROUTERS = ("round_robin", "least_loaded", "prefix_affinity", "kv_aware", "kv_aware_decode")
_MEMORY_KEYS = ("tiers", "capacity", "preset", "source", "hbm_eviction", "write", "eviction",
                "prefetch", "backup", "hit_refresh", "promote_fill", "storage_prefetch",
                "load_overlap", "hbm_evict_backed_first")
# SchedulerConfig field -> (TOML type, what is expected, check).
_SCHEDULER: dict[str, tuple[type, str, Any]] = {
    "max_num_seqs": (int, EXPECTED["max_num_seqs"], None),  # ranges: engine.sim.capacity
    "max_num_batched_tokens": (int, "an integer >= 1", lambda v: v >= 1),
    "policy": (str, f"one of {', '.join(POLICIES + OTHER_POLICIES)}",
               lambda v: v in POLICIES + OTHER_POLICIES),
    "enable_chunked_prefill": (bool, "true or false", None),
    "enable_prefix_caching": (bool, "true or false", None),
    "block_size": (int, "a positive integer", lambda v: v >= 1),
    "kv_cache_dtype": (str, f"one of {', '.join(repr(k) for k in KV_CACHE_DTYPES)}",
                       lambda v: v in KV_CACHE_DTYPES),
    "gpu_memory_utilization": (float, "a number in (0, 1]", lambda v: 0 < v <= 1),
    "kv_cache_capacity": (float, "a number of bytes >= 0 (0 = derived)", lambda v: v >= 0),
    "max_model_len": (int, "an integer >= 1", lambda v: v >= 1),
    "long_prefill_token_threshold": (int, "an integer >= 0 (0 = no cap)", lambda v: v >= 0),
    "max_waiting": (int, EXPECTED["max_waiting"], None),
    "engine": (str, f"one of {', '.join(PROFILES)}", lambda v: v in PROFILES),
}
assert set(_SCHEDULER) == {f.name for f in fields(SchedulerConfig)}
# Scheduler keys inference-lab has that are parsed, not simulated: key -> (type, what,
# check, value that changes nothing).
_SCHEDULER_PARSED: dict[str, tuple[type, str, Any, Any]] = {
    "max_num_partial_prefills": (int, "an integer >= 1", lambda v: v >= 1, 1),
    "enable_preemption_free": (bool, "true or false", None, False),
    "enable_cascade_attention": (bool, "true or false", None, False),
}


def _check_max_waiting(max_waiting: Any) -> None:
    if max_waiting is None:
        return
    if type(max_waiting) is not int:
        raise ConfigError("--max-waiting", "", f"expected {EXPECTED['max_waiting']}, got {max_waiting!r}")
    if (expected := out_of_range("max_waiting", max_waiting)) is not None:
        raise ConfigError("--max-waiting", "", f"expected {expected}, got {max_waiting!r}")


def _check_kv_cache_dtype(kv_cache_dtype: Any) -> None:
    if kv_cache_dtype is not None and kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ConfigError("--kv-cache-dtype", "", f"expected one of "
                          f"{', '.join(repr(k) for k in KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")


def _unknown_hardware(name: Any, cat: Catalog) -> ConfigError:
    return ConfigError("", "", f"unknown hardware {name!r}; known presets: "
                       f"{', '.join(cat.hardware_names())}")


def _scheduler_keys(t: Table) -> dict[str, tuple[Any, str]]:
    """The keys set in a scheduler table: name -> (value, key path it came from)."""
    found = {}
    for name, (kind, what, ok) in {**_SCHEDULER, **{k: v[:3] for k, v in _SCHEDULER_PARSED.items()}}.items():
        value = t.get(name, kind, what, None, ok=ok)
        if value is not None:
            if name == "kv_cache_capacity":
                value = int(value) or None
            found[name] = (value, t.key(name))
    t.done()
    return found


def _build_scheduler(keys: dict[str, tuple[Any, str]], model: Model, where: str,
                     notes: list[str]) -> SchedulerConfig:
    sched = SchedulerConfig(**{name: value for name, (value, _) in keys.items() if name in _SCHEDULER})
    for name, (_, _, _, neutral) in _SCHEDULER_PARSED.items():
        if name in keys and keys[name][0] != neutral:
            notes.append(f"scheduler {name} = {keys[name][0]!r}: parsed, not modelled")
    if sched.policy in OTHER_POLICIES:
        notes.append(f"scheduler policy {sched.policy!r}: parsed, scheduled as fcfs")
        sched = replace(sched, policy="fcfs")

    def path(name: str) -> str:
        return keys.get(name, (None, f"scheduler.{name}"))[1]

    for name in ("max_num_seqs", "max_waiting"):
        if (expected := out_of_range(name, getattr(sched, name))) is not None:
            raise ConfigError(where, path(name), f"expected {expected}, got {getattr(sched, name)!r}")
    if not seqs_fit_budget(sched.max_num_seqs, sched.max_num_batched_tokens):
        raise ConfigError(where, path("max_num_batched_tokens"),
                          f"expected an integer >= max_num_seqs ({sched.max_num_seqs}), "
                          f"got {sched.max_num_batched_tokens!r}")
    if sched.max_model_len is not None and sched.max_model_len > model.max_seq_len:
        raise ConfigError(where, path("max_model_len"),
                          f"expected at most the model's max_seq_len ({model.max_seq_len}), "
                          f"got {sched.max_model_len!r}")
    return sched


def _parse_model(top: Table, served: str, cat: Catalog) -> Model:
    where = top.where
    if "model" not in top.data:
        raise ConfigError(where, "model", "missing; expected a catalog model name "
                          f"({', '.join(cat.model_names())}) or a [model] table")
    if isinstance(top.data["model"], dict):
        return bundled.parse_model(top.table("model").data, where, "model", name=served)
    name = top.get("model", str, "a catalog model name or a [model] table")
    try:
        return cat.load_model(name)
    except ConfigError as exc:
        if exc.where:  # the preset file itself is bad: name it
            raise
        raise ConfigError(where, "model", exc.message) from None


def _parse_router(t: Table | None, label: str, notes: list[str]) -> None:
    if t is None:
        return
    policy = t.get("policy", str, " | ".join(_ROUTERS), "round_robin", ok=lambda v: v in _ROUTERS)
    t.get("max_load_ratio", float, "a number > 0", None, ok=lambda v: v > 0)
    t.get("load_weight", float, "a number >= 0", None, ok=lambda v: v >= 0)
    t.done()
    notes.append(f"{label} ({policy}): parsed, not modelled (one replica)")


_PD_KEYS = ("prefill", "decode", "link", "policy")


def parse_pd(t: Table | None, hardware: Hardware) -> PdLayout | None:
    """The [pd] table: prefill and decode replica counts (each >= 1), the link into a
    decode replica (nvlink | rdma | GBPS[@MS]) and the router's policy."""
    if t is None:
        return None
    prefill = t.get("prefill", int, "an integer >= 1 (prefill replicas)", ok=lambda v: v >= 1)
    decode = t.get("decode", int, "an integer >= 1 (decode replicas)", ok=lambda v: v >= 1)
    link = t.get("link", str, "nvlink, rdma or GBPS[@LATENCY_MS]", "rdma")
    try:
        link_preset(link, hardware)
    except ValueError as exc:
        raise ConfigError(t.where, t.key("link"), str(exc)) from None
    policy = t.get("policy", str, " | ".join(PD_POLICIES), "least_loaded",
                   ok=lambda v: v in PD_POLICIES)
    t.done()
    return PdLayout(prefill, decode, link, policy)


def _parse_memory(t: Table | None, hardware: Hardware, tp: int, notes: list[str]):
    """The [memory] tiers as KV offloading's host and disk tiers (engine.sim.offload.
    memory_tiers; None: no offloading); the policies are checked for their names only."""
    if t is None:
        return None
    tiers = t.get("tiers", list, "a list of store names", [],
                  ok=lambda v: all(isinstance(x, str) for x in v))
    for tier in tiers:
        if tier not in hardware.memory_stores:
            raise ConfigError(t.where, t.key("tiers"), f"unknown store {tier!r}; "
                              f"{hardware.name} offers: {', '.join(hardware.memory_stores) or 'none'}")
    caps = {}
    capacity = t.table("capacity", None, hardware.memory_stores)
    if capacity is not None:  # bytes per instance, per store
        caps = {name: capacity.get(name, float, "a number > 0 (bytes per instance)", None,
                                   ok=lambda v: v > 0) for name in hardware.memory_stores}
        caps = {name: v for name, v in caps.items() if v is not None}
        capacity.done()
    policies = [key for key in _MEMORY_KEYS if key not in ("tiers", "capacity") and key in t.data]
    t.refuse_unknown(_MEMORY_KEYS)
    offload, tier_notes = offload_from_tiers(tiers, caps, hardware, tp)
    notes += tier_notes if tiers else ["memory tiers (none): parsed, not modelled"]
    if policies:
        notes.append(f"memory {', '.join(policies)}: parsed, not modelled (the offload tiers "
                     "write through and evict LRU)")
    return offload


class _Shared:
    """The file-level tables an entry may replace: (table or None, key path)."""

    def __init__(self, top: Table) -> None:
        self.tables = {key: top.table(key, None) for key in
                       ("speculative", "router", "decode_router", "memory", "fault")}
        self.tables["pd"] = top.table("pd", None, _PD_KEYS)


def _entry_hardware(entry: Table, hw_name: str, cat: Catalog) -> Hardware:
    spec = entry.data.get("spec")
    if spec is None:
        if hw_name not in cat.hardware_names():
            raise ConfigError(entry.where, entry.path, f"unknown hardware preset {hw_name!r}; known "
                              f"presets: {', '.join(cat.hardware_names())} (or give `spec`)")
        entry.get("spec", str, "", None)
        return cat.load_hardware(hw_name)
    if isinstance(spec, dict):
        entry.table("spec")
        return replace(bundled.parse_hardware(spec, entry.where, entry.key("spec"), name=hw_name))
    name = entry.get("spec", str, "a hardware preset name or an inline hardware table")
    try:
        return replace(cat.load_hardware(name), name=hw_name)
    except ConfigError as exc:
        raise ConfigError(entry.where, entry.key("spec"), exc.message) from None


def _parse_entry(entry: Table, hw_name: str, model: Model, served: str,
                 base: dict[str, tuple[Any, str]], shared: _Shared, cat: Catalog) -> Deployment:
    entry.refuse_unknown(_ENTRY_KEYS)
    notes: list[str] = []
    hardware = _entry_hardware(entry, hw_name, cat)
    timing = entry.get("timing", str, generations.TIMING_HELP, "roofline", ok=generations.is_timing)
    tp = entry.get("tp", int, "an integer >= 1", 1, ok=lambda v: v >= 1)
    ep = entry.get("ep", int, f"an integer >= 1 dividing tp ({tp})", 1,
                   ok=lambda v: v >= 1 and tp % v == 0)
    if entry.get("dp_attention", bool, "true or false", False):
        notes.append("dp_attention: parsed, priced as tensor-parallel attention")
    replicas = entry.get("replicas", int, "an integer >= 1", 1, ok=lambda v: v >= 1)
    if replicas > 1:
        notes.append(f"replicas = {replicas}: parsed, one replica simulated")
    if (tp > 1 or ep > 1) and not hardware.link_bandwidth:
        raise ConfigError(entry.where, entry.key("tp"), f"tp {tp} / ep {ep} needs a [fabric] on "
                          f"{hardware.name}, which has none")
    if hardware.gpus_per_node and tp > hardware.gpus_per_node and not hardware.scale_out_bandwidth:
        raise ConfigError(entry.where, entry.key("tp"), f"tp {tp} spans nodes of "
                          f"{hardware.gpus_per_node} GPUs; {hardware.name} has no fabric.scale_out")
    override = entry.table("scheduler", None, tuple(_SCHEDULER) + tuple(_SCHEDULER_PARSED))
    keys = {**base, **(_scheduler_keys(override) if override is not None else {})}
    tc = entry.table("time_correction", None, ("alpha", "beta"))
    correction = TimeCorrection()
    if tc is not None:
        correction = TimeCorrection(
            alpha=tc.get("alpha", float, "a number > 0", 1.0, ok=lambda v: v > 0),
            beta=tc.get("beta", float, "a number >= 0 (seconds)", 0.0, ok=lambda v: v >= 0))
        tc.done()
    tables = {key: entry.table(key, None) or shared.tables[key]
              for key in ("speculative", "router", "decode_router", "memory")}
    speculative = None
    if tables["speculative"] is not None:
        speculative, spec_notes = parse_speculative(tables["speculative"], Path(entry.where).parent)
        notes += spec_notes
    _parse_router(tables["router"], "router", notes)
    _parse_router(tables["decode_router"], "decode_router", notes)
    offload = _parse_memory(tables["memory"], hardware, tp, notes)
    if shared.tables["fault"] is not None:
        notes.append("[fault]: applied by the gateway (injected errors, retry hints, a static "
                     "directive), not the engine")
    pd = parse_pd(Table(dict(shared.tables["pd"].data), entry.where, "pd")
                  if shared.tables["pd"] is not None else None, hardware)
    entry.done()
    sched = _build_scheduler(keys, model, entry.where, notes)
    _check_fit(model, hardware, tp, sched, entry)
    dep = Deployment(name=served, model=model, hardware=hardware, tp=tp, scheduler=sched,
                     time_correction=correction, source=entry.where, ep=ep,
                     speculative=speculative, unmodelled=tuple(dict.fromkeys(notes)),
                     timing=timing, pd=pd, offload=offload)
    # an engine profile named in [scheduler] (engine.sim.profiles): its settings on top
    return dep if sched.engine == "vllm" else apply_profile(dep, sched.engine, sched.max_waiting)


def _check_fit(model: Model, hardware: Hardware, tp: int, sched: SchedulerConfig,
               entry: Table) -> None:
    """Refuse an entry whose weights leave no room for KV (unless the KV size is given)."""
    usable = hardware.hbm_bytes * tp * sched.gpu_memory_utilization
    weights = bundled.weight_bytes(model)
    if sched.kv_cache_capacity is None and usable <= weights:
        raise ConfigError(entry.where, entry.key("tp"),
                          f"{model.name} weights ({weights / 1e9:.1f} GB) do not fit in {tp} x "
                          f"{hardware.name} at gpu_memory_utilization {sched.gpu_memory_utilization} "
                          f"({usable / 1e9:.1f} GB); raise tp")


def _log_precision_fallbacks(dep: Deployment) -> None:
    needed = {s.precision for s in dep.model.weight_streams} | {dep.model.attention_precision}
    for precision in sorted(needed):
        priced = bundled.compute_precision(dep.hardware, precision)
        if priced is None:
            raise ConfigError(dep.source, "", f"{dep.model.name} needs {precision} compute, which "
                              f"{dep.hardware.name} lacks at that or any wider precision")
        if priced != precision:
            logger.info("%s on %s: %s is priced at %s (%s has no %s peak)", dep.name,
                        dep.hardware.name, precision, priced, dep.hardware.name, precision)


def _parse_entries(hw_table: Table | None, model: Model, served: str,
                   base: dict[str, tuple[Any, str]], shared: _Shared,
                   cat: Catalog) -> dict[str, Deployment]:
    """Every [hardware.<name>] entry, by lower-case name."""
    entries: dict[str, Deployment] = {}
    if hw_table is None:
        return entries
    for key in hw_table.data:
        hw = key.lower()
        if hw in entries:
            raise ConfigError(hw_table.where, hw_table.key(key), f"a second entry for {hw!r}")
        entries[hw] = _parse_entry(hw_table.table(key), hw, model, served, base, shared, cat)
    hw_table.done()
    return entries


def _check_timing(timing: Any) -> None:
    if timing is not None and not generations.is_timing(timing):
        raise ConfigError("--timing", "", f"expected {generations.TIMING_HELP}, got {timing!r}")


def _apply_timing(dep: Deployment, timing: str | None) -> None:
    """Use `timing` when given (the --timing flag), and refuse a calibrated timing on
    hardware without a fit; `calibrated-v<version>` picks that vLLM generation's fit
    (engine.sim.generations), refused by name on a preset without one."""
    if timing is not None:
        dep.timing = timing
    dep.timing, version = generations.parse_timing(dep.timing)
    if version and dep.scheduler.engine != "vllm":
        raise ConfigError(dep.source, "timing", f"calibrated-v{version} is a fit of vLLM; the "
                          f"{dep.scheduler.engine} engine profile has its own (--timing calibrated)")
    if version:
        try:
            dep.hardware = generations.select(dep.hardware, version)
        except ValueError as exc:
            raise ConfigError(dep.source, "timing", str(exc)) from None
    if dep.timing == "calibrated" and dep.hardware.calibration is None:
        raise ConfigError(dep.source, "timing", f"calibrated timing needs a [calibration] table in "
                          f"the {dep.hardware.name} hardware preset (inference_lab.calibrate.fit_presets "
                          "fits one); this one has none")
    cal = dep.hardware.calibration
    if dep.timing == "calibrated" and cal.transferred_from:
        _log_transferred(dep.hardware.name, cal.transferred_from)
    if (dep.timing == "calibrated" and dep.scheduler.kv_cache_capacity is None
            and kv.total_blocks(dep) == 0):
        sched = dep.scheduler
        raise ConfigError(dep.source, "tp", f"{dep.model.name} weights "
                          f"({kv.weight_bytes(dep) / dep.tp / 1e9:.1f} GB per GPU) and the calibrated "
                          f"memory reserve ({kv.reserve_bytes(dep) / 1e9:.1f} GB per GPU) leave no KV "
                          f"cache on {dep.hardware.name} at gpu_memory_utilization "
                          f"{sched.gpu_memory_utilization}; raise tp")


@functools.cache
def _log_transferred(hardware: str, source: str) -> None:
    """Say once per process that `hardware`'s calibration is carried over, not fitted."""
    logger.warning("calibrated timing on %s uses a calibration transferred from the %s fit, "
                   "not fitted on %s (no public %s data with full settings; docs/timing.md)",
                   hardware, source, hardware, hardware)


def load_deployment(path: str | Path, hardware: str, max_waiting: int | None = None,
                    catalog: Catalog | None = None, timing: str | None = None,
                    kv_cache_dtype: str | None = None) -> Deployment | None:
    """The deployment of the model in `path` on `hardware`, or None (logged) when the file
    has no [hardware.<hardware>] entry. Every entry is validated either way.
    `max_waiting`, when not None, replaces the file's value; so do `timing` ('roofline'
    or 'calibrated') for the entry's and `kv_cache_dtype` (--kv-cache-dtype) for the
    scheduler's. Presets come from `catalog` (default: the bundled one)."""
    cat = catalog or bundled.BUNDLED
    if not isinstance(hardware, str):
        raise _unknown_hardware(hardware, cat)
    hw_wanted = hardware.lower()
    _check_max_waiting(max_waiting)
    _check_timing(timing)
    _check_kv_cache_dtype(kv_cache_dtype)
    where = str(path)
    top = Table(read_toml(path), where, keys=_TOP_KEYS)
    served = top.get("name", str, "a non-empty string", Path(path).stem, ok=bool)
    model = _parse_model(top, served, cat)
    base_table = top.table("scheduler", None, tuple(_SCHEDULER) + tuple(_SCHEDULER_PARSED))
    base = _scheduler_keys(base_table) if base_table is not None else {}
    shared = _Shared(top)
    entries = _parse_entries(top.table("hardware", None), model, served, base, shared, cat)
    top.done()
    dep = entries.get(hw_wanted)
    if dep is None:
        if hw_wanted not in cat.hardware_names():
            raise _unknown_hardware(hardware, cat)
        logger.info("%s: no [hardware.%s] entry; model %s skipped", where, hw_wanted, served)
        return None
    if max_waiting is not None:
        dep.scheduler = replace(dep.scheduler, max_waiting=max_waiting)
    if kv_cache_dtype is not None:
        dep.scheduler = replace(dep.scheduler, kv_cache_dtype=kv_cache_dtype)
    _apply_timing(dep, timing)
    _log_precision_fallbacks(dep)
    for note in dep.unmodelled:
        logger.warning("%s on %s: %s", dep.name, dep.hardware.name, note)
    return dep


def load_config_dir(path: str | Path, hardware: str, max_waiting: int | None = None,
                    catalog: Catalog | None = None, timing: str | None = None,
                    kv_cache_dtype: str | None = None) -> list[Deployment]:
    """Every `*.toml` directly in the directory `path` (sorted by name), or the single file
    `path`, as deployments on `hardware`. Refuses an empty result and duplicate served names."""
    cat = catalog or bundled.BUNDLED
    _check_max_waiting(max_waiting)
    root = Path(path)
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = sorted(p for p in root.glob("*.toml") if p.is_file())
        if not files:
            raise ConfigError(str(root), "", "no *.toml deployment configs in this directory")
    else:
        raise ConfigError(str(root), "", "no such file or directory")
    deployments: dict[str, Deployment] = {}
    for file in files:
        dep = load_deployment(file, hardware, max_waiting, cat, timing, kv_cache_dtype)
        if dep is None:
            continue
        if dep.name in deployments:
            raise ConfigError(str(file), "name", f"served model name {dep.name!r} is already used "
                              f"by {deployments[dep.name].source}")
        deployments[dep.name] = dep
    if not deployments:
        raise ConfigError(str(root), "", f"no model has a [hardware.{hardware.lower()}] entry")
    return list(deployments.values())


def default_deployments(hardware: str = "b200", max_waiting: int | None = None,
                        catalog: Catalog | None = None, timing: str | None = None,
                        kv_cache_dtype: str | None = None) -> list[Deployment]:
    """The embedded default: gpt-oss-20b, from package data `engine/sim/presets/default.toml`."""
    cat = catalog or bundled.BUNDLED
    if not isinstance(hardware, str) or hardware.lower() not in cat.hardware_names():
        raise _unknown_hardware(hardware, cat)
    with resources.as_file(resources.files("inference_lab.engine.sim") / "presets" / "default.toml") as path:
        return load_config_dir(path, hardware, max_waiting, cat, timing, kv_cache_dtype)
