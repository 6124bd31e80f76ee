"""Small builders shared by the pure core tests."""

from __future__ import annotations

from inference_lab.engine.sim.catalog import load_hardware, load_model
from inference_lab.engine.sim.core import EngineCore
from inference_lab.engine.sim.specs import Deployment, SchedulerConfig, TimeCorrection


def deployment(model: str = "gpt-oss-20b", hardware: str = "b200", tp: int = 1,
               time_correction: TimeCorrection | None = None, **scheduler) -> Deployment:
    """A deployment with the reference page's scheduler (block 64, budget 8192)."""
    settings = {"block_size": 64, "max_num_batched_tokens": 8192, "max_num_seqs": 256}
    settings.update(scheduler)
    return Deployment(
        name=model, model=load_model(model), hardware=load_hardware(hardware), tp=tp,
        scheduler=SchedulerConfig(**settings),
        time_correction=time_correction or TimeCorrection(),
    )


def core(lengths=None, **kwargs) -> EngineCore:
    return EngineCore(deployment(**kwargs), lengths)


def run_until_idle(engine: EngineCore, now: float = 0.0, max_steps: int = 1_000_000):
    """Step until no work is left; returns (end time, every StepResult)."""
    results = []
    while engine.has_work() and len(results) < max_steps:
        result = engine.step(now)
        now = result.end
        results.append(result)
    return now, results
