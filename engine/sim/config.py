"""Deployment configs: one TOML file per served model, one entry per GPU it can run on.

Knows inference-lab's deployment layout:

    name = "served-name"           # optional; default: the file stem
    model = "gpt-oss-20b"          # a catalog preset, or an inline [model] table
    [scheduler]                    # the fields of engine.specs.SchedulerConfig
    max_num_seqs = 256
    [hardware.b200]                # the key must be a hardware preset
    tp = 1                         # optional, default 1
    scheduler = { max_num_seqs = 64 }            # optional, merged over [scheduler]
    time_correction = { alpha = 1.0, beta = 0.0 }  # optional

and refuses, with the file and the key path, unknown keys, wrong types and impossible
values (weights that do not fit included), so that a bad config never starts a server.
Does not know how a step is timed or how the KV pool is laid out (cost, kv modules).
"""

from __future__ import annotations

import logging
from dataclasses import fields
from importlib import resources
from pathlib import Path
from typing import Any

from inference_lab.engine.sim import catalog
from inference_lab.common.toml import ConfigError, Table, read_toml
from inference_lab.engine.sim.specs import MAX_COUNT, Deployment, Hardware, Model, SchedulerConfig, TimeCorrection

__all__ = ["ConfigError", "load_deployment", "load_config_dir", "default_deployments"]

logger = logging.getLogger(__name__)

POLICIES = ("fcfs", "priority")

_TOP_KEYS = ("name", "model", "scheduler", "hardware")
_ENTRY_KEYS = ("tp", "scheduler", "time_correction")
# SchedulerConfig field -> (TOML type, what is expected, check).
_SCHEDULER: dict[str, tuple[type, str, Any]] = {
    "max_num_seqs": (int, "an integer >= 1", lambda v: v >= 1),
    "max_num_batched_tokens": (int, "an integer >= 1", lambda v: v >= 1),
    "policy": (str, "'fcfs' or 'priority'", lambda v: v in POLICIES),
    "enable_chunked_prefill": (bool, "true or false", None),
    "block_size": (int, "a positive integer", lambda v: v >= 1),
    "gpu_memory_utilization": (float, "a number in (0, 1]", lambda v: 0 < v <= 1),
    "kv_cache_capacity": (float, "a positive number of bytes", lambda v: v >= 1),
    "max_model_len": (int, "an integer >= 1", lambda v: v >= 1),
    "long_prefill_token_threshold": (int, "an integer >= 0 (0 = no cap)", lambda v: v >= 0),
    "max_waiting": (int, "an integer >= 0 (0 = unbounded)", lambda v: v >= 0),
}
assert set(_SCHEDULER) == {f.name for f in fields(SchedulerConfig)}


def _check_hardware_arg(hardware: Any) -> str:
    known = catalog.hardware_names()
    if not isinstance(hardware, str) or hardware.lower() not in known:
        raise ConfigError("", "", f"unknown hardware {hardware!r}; known presets: {', '.join(known)}")
    return hardware.lower()


def _check_max_waiting(max_waiting: Any) -> None:
    if max_waiting is not None and (type(max_waiting) is not int or max_waiting < 0):
        raise ConfigError("--max-waiting", "", f"expected an integer >= 0, got {max_waiting!r}")
    if max_waiting is not None and max_waiting > MAX_COUNT:
        raise ConfigError("--max-waiting", "", f"expected at most {MAX_COUNT}, got {max_waiting!r}")


def _scheduler_keys(t: Table) -> dict[str, tuple[Any, str]]:
    """The keys set in a scheduler table: name -> (value, key path it came from)."""
    found = {}
    for name, (kind, what, ok) in _SCHEDULER.items():
        value = t.get(name, kind, what, None, ok=ok)
        if value is not None:
            found[name] = (int(value) if name == "kv_cache_capacity" else value, t.key(name))
    t.done()
    return found


def _build_scheduler(keys: dict[str, tuple[Any, str]], model: Model, where: str) -> SchedulerConfig:
    sched = SchedulerConfig(**{name: value for name, (value, _) in keys.items()})

    def path(name: str) -> str:
        return keys.get(name, (None, f"scheduler.{name}"))[1]

    if sched.max_num_batched_tokens < sched.max_num_seqs:
        raise ConfigError(where, path("max_num_batched_tokens"),
                          f"expected an integer >= max_num_seqs ({sched.max_num_seqs}), "
                          f"got {sched.max_num_batched_tokens!r}")
    for name in ("max_num_seqs", "max_waiting"):  # reported as uint32 (engine.proto)
        if getattr(sched, name) > MAX_COUNT:
            raise ConfigError(where, path(name),
                              f"expected at most {MAX_COUNT}, got {getattr(sched, name)!r}")
    if sched.max_model_len is not None and sched.max_model_len > model.max_seq_len:
        raise ConfigError(where, path("max_model_len"),
                          f"expected at most the model's max_seq_len ({model.max_seq_len}), "
                          f"got {sched.max_model_len!r}")
    return sched


def _parse_model(top: Table, served: str) -> Model:
    where = top.where
    if "model" not in top.data:
        raise ConfigError(where, "model", "missing; expected a catalog model name "
                          f"({', '.join(catalog.model_names())}) or a [model] table")
    if isinstance(top.data["model"], dict):
        return catalog.parse_model(top.table("model").data, where, "model", name=served)
    name = top.get("model", str, "a catalog model name or a [model] table")
    try:
        return catalog.load_model(name)
    except ConfigError as exc:
        raise ConfigError(where, "model", exc.message) from None


def _parse_entry(entry: Table, hw_name: str, model: Model, served: str,
                 base: dict[str, tuple[Any, str]]) -> Deployment:
    tp = entry.get("tp", int, "an integer >= 1", 1, ok=lambda v: v >= 1)
    override = entry.table("scheduler", None, tuple(_SCHEDULER))
    keys = {**base, **(_scheduler_keys(override) if override is not None else {})}
    tc = entry.table("time_correction", None, ("alpha", "beta"))
    correction = TimeCorrection()
    if tc is not None:
        correction = TimeCorrection(
            alpha=tc.get("alpha", float, "a number > 0", 1.0, ok=lambda v: v > 0),
            beta=tc.get("beta", float, "a number >= 0 (seconds)", 0.0, ok=lambda v: v >= 0))
        tc.done()
    entry.done()
    sched = _build_scheduler(keys, model, entry.where)
    hardware = catalog.load_hardware(hw_name)
    _check_fit(model, hardware, tp, sched, entry)
    return Deployment(name=served, model=model, hardware=hardware, tp=tp, scheduler=sched,
                      time_correction=correction, source=entry.where)


def _check_fit(model: Model, hardware: Hardware, tp: int, sched: SchedulerConfig,
               entry: Table) -> None:
    """Refuse an entry whose weights leave no room for KV (unless the KV size is given)."""
    usable = hardware.hbm_bytes * tp * sched.gpu_memory_utilization
    weights = catalog.weight_bytes(model)
    if sched.kv_cache_capacity is None and usable <= weights:
        raise ConfigError(entry.where, entry.key("tp"),
                          f"{model.name} weights ({weights / 1e9:.1f} GB) do not fit in {tp} x "
                          f"{hardware.name} at gpu_memory_utilization {sched.gpu_memory_utilization} "
                          f"({usable / 1e9:.1f} GB); raise tp")


def _log_precision_fallbacks(dep: Deployment) -> None:
    needed = {s.precision for s in dep.model.weight_streams} | {dep.model.attention_precision}
    for precision in sorted(needed):
        priced = catalog.compute_precision(dep.hardware, precision)
        if priced is None:
            raise ConfigError(dep.source, "", f"{dep.model.name} needs {precision} compute, which "
                              f"{dep.hardware.name} lacks at that or any wider precision")
        if priced != precision:
            logger.info("%s on %s: %s is priced at %s (%s has no %s peak)", dep.name,
                        dep.hardware.name, precision, priced, dep.hardware.name, precision)


def _parse_entries(hw_table: Table | None, model: Model, served: str,
                   base: dict[str, tuple[Any, str]]) -> dict[str, Deployment]:
    """Every [hardware.<preset>] entry, by lower-case preset name."""
    entries: dict[str, Deployment] = {}
    if hw_table is None:
        return entries
    known = catalog.hardware_names()
    for key in hw_table.data:
        hw = key.lower()
        if hw not in known:
            raise ConfigError(hw_table.where, hw_table.key(key), f"unknown hardware preset {key!r}; "
                              f"known presets: {', '.join(known)}")
        if hw in entries:
            raise ConfigError(hw_table.where, hw_table.key(key), f"a second entry for {hw!r}")
        entries[hw] = _parse_entry(hw_table.table(key, keys=_ENTRY_KEYS), hw, model, served, base)
    hw_table.done()
    return entries


def load_deployment(path: str | Path, hardware: str,
                    max_waiting: int | None = None) -> Deployment | None:
    """The deployment of the model in `path` on `hardware`, or None (logged) when the file
    has no [hardware.<hardware>] entry. Every entry is validated either way.
    `max_waiting`, when not None, replaces the file's value."""
    hw_wanted = _check_hardware_arg(hardware)
    _check_max_waiting(max_waiting)
    where = str(path)
    top = Table(read_toml(path), where, keys=_TOP_KEYS)
    served = top.get("name", str, "a non-empty string", Path(path).stem, ok=bool)
    model = _parse_model(top, served)
    base_table = top.table("scheduler", None, tuple(_SCHEDULER))
    base = _scheduler_keys(base_table) if base_table is not None else {}
    entries = _parse_entries(top.table("hardware", None), model, served, base)
    top.done()
    dep = entries.get(hw_wanted)
    if dep is None:
        logger.info("%s: no [hardware.%s] entry; model %s skipped", where, hw_wanted, served)
        return None
    if max_waiting is not None:
        dep.scheduler.max_waiting = max_waiting
    _log_precision_fallbacks(dep)
    return dep


def load_config_dir(path: str | Path, hardware: str,
                    max_waiting: int | None = None) -> list[Deployment]:
    """Every `*.toml` directly in the directory `path` (sorted by name), or the single file
    `path`, as deployments on `hardware`. Refuses an empty result and duplicate served names."""
    hardware = _check_hardware_arg(hardware)
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
        dep = load_deployment(file, hardware, max_waiting)
        if dep is None:
            continue
        if dep.name in deployments:
            raise ConfigError(str(file), "name", f"served model name {dep.name!r} is already used "
                              f"by {deployments[dep.name].source}")
        deployments[dep.name] = dep
    if not deployments:
        raise ConfigError(str(root), "", f"no model has a [hardware.{hardware}] entry")
    return list(deployments.values())


def default_deployments(hardware: str = "b200", max_waiting: int | None = None) -> list[Deployment]:
    """The embedded default: gpt-oss-20b, from package data `engine/catalog/default.toml`."""
    with resources.as_file(resources.files("inference_lab.engine.sim") / "presets" / "default.toml") as path:
        return load_config_dir(path, hardware, max_waiting)
