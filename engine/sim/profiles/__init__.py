"""Engine profiles: which serving engine the simulation imitates, as a client sees it.

Knows, per engine, the scheduler's policy knobs (the admission rule, whether prefill and
decode share a step), the prefix cache's granularity (its block size), the default of the
prompt-chunk budget, the queue's default bound, and what a refusal says and with which HTTP
status; the metric names and HTTP routes follow the profile's name (engine.metrics.sglang,
gateway.sglang). `vllm` is the lab's own behaviour, unchanged; `sglang` is SGLang's
(docs/engines.md, with sources). The cost model is shared: a profile changes scheduling,
not what a step costs on the hardware (a calibrated preset may carry a profile's own fit).

Does not know: time, drivers, services or HTTP.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Iterator
from importlib import resources
from dataclasses import dataclass

from inference_lab.engine.sim.scheduler import Scheduler
from inference_lab.engine.sim.specs import Calibration, Deployment, SchedulerConfig

__all__ = ["PROFILES", "EngineProfile", "ProfileError", "apply", "make_scheduler", "profile_of"]


class ProfileError(ValueError):
    """An engine name no profile has, or a setting the profile does not take."""


@dataclass(frozen=True, slots=True)
class EngineProfile:
    name: str
    block_size: int | None = None  # the prefix cache's granularity (None: the config's)
    separate_passes: bool = False  # a step is a prefill batch or a decode batch, never both
    # the prompt-chunk budget by the GPU's memory: ((below GiB, tokens), ...); () = the config's
    chunk_by_memory: tuple[tuple[float, int], ...] = ()
    refusal_message: str = ""  # what a full queue's refusal says ("" = the lab's own text)
    saturated_status: int = 529  # the HTTP status of that refusal
    metric_prefix: str = "vllm:"


VLLM = EngineProfile("vllm")
# SGLang: token-granular radix cache (page_size 1), prefill and decode as separate forward
# passes (enable_mixed_chunk off), --chunked-prefill-size by GPU memory (_handle_gpu_memory_
# settings: 2048 < 35 GiB, 4096 < 60, 8192 < 160, else 16384), an unbounded queue unless
# --max-queued-requests, whose refusal is a 503 "The request queue is full.".
SGLANG = EngineProfile("sglang", block_size=1, separate_passes=True,
                       chunk_by_memory=((35, 2048), (60, 4096), (160, 8192), (float("inf"), 16384)),
                       refusal_message="The request queue is full.", saturated_status=503,
                       metric_prefix="sglang:")
PROFILES: dict[str, EngineProfile] = {p.name: p for p in (VLLM, SGLANG)}


def profile_of(config: SchedulerConfig) -> EngineProfile:
    return PROFILES[config.engine]


def chunk_size(profile: EngineProfile, hbm_bytes: float, configured: int) -> int:
    """The prompt-chunk budget the profile defaults to on a GPU of `hbm_bytes`."""
    gib = hbm_bytes / 2**30
    for below, tokens in profile.chunk_by_memory:
        if gib < below:
            return tokens
    return configured


def apply(deployment: Deployment, engine: str, max_queued: int | None = None) -> Deployment:
    """`deployment` as the `engine` profile runs it. vllm: unchanged. sglang: its cache
    granularity and chunk default, and its queue bound: `max_queued` requests (SGLang's
    --max-queued-requests), else unbounded."""
    profile = PROFILES.get(engine)
    if profile is None:
        raise ProfileError(f"--engine: expected one of {', '.join(PROFILES)}, got {engine!r}")
    if profile is VLLM:
        return deployment
    sched = deployment.scheduler
    changes = {"engine": profile.name, "max_waiting": max_queued or 0,
               "max_num_batched_tokens": chunk_size(profile, deployment.hardware.hbm_bytes,
                                                    sched.max_num_batched_tokens)}
    if profile.block_size is not None:
        changes["block_size"] = profile.block_size
    deployment = dataclasses.replace(deployment, scheduler=dataclasses.replace(sched, **changes))
    fitted = calibration(profile.name, deployment.hardware.name)
    if fitted is not None:  # the profile's own fit on this GPU (`--timing calibrated`)
        deployment = dataclasses.replace(
            deployment, hardware=dataclasses.replace(deployment.hardware, calibration=fitted))
    return deployment


def calibration(engine: str, hardware: str) -> Calibration | None:
    """The profile's own [calibration] on `hardware` (calibration.toml), if fitted."""
    table = tomllib.loads(resources.files(__package__).joinpath("calibration.toml")
                          .read_text(encoding="utf-8")).get(engine, {}).get(hardware)
    return Calibration(**table) if table is not None else None


def make_scheduler(config: SchedulerConfig, total_blocks: int, windows: tuple[int, ...],
                   fixed_blocks: int = 0, record_kv_events: bool = False,
                   ids: Iterator[int] | None = None) -> Scheduler:
    """The scheduler of the config's engine profile."""
    if config.engine == "sglang":
        from inference_lab.engine.sim.profiles.sglang import SglangScheduler

        return SglangScheduler(config, total_blocks, windows, fixed_blocks, record_kv_events, ids)
    return Scheduler(config, total_blocks, windows, fixed_blocks, record_kv_events, ids)
