"""Small builders shared by the pure core tests."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from inference_lab.engine.sim.catalog import Catalog, load_hardware, load_model
from inference_lab.engine.sim.core import EngineCore
from inference_lab.engine.sim.specs import Calibration, Deployment, Hardware, SchedulerConfig, TimeCorrection

# The calibrate tests' reference engine: the h100 preset's peaks with a [calibration] fixed
# here, not the shipped one, so that a refit of the preset does not move what those tests
# fit, recover and pin.
REFERENCE_CALIBRATION = Calibration(
    bandwidth_efficiency=0.988, flops_efficiency=0.502, moe_flops_efficiency=0.0998,
    flops_half_tokens=74.1, step_overhead=0.00295, request_overhead=0.0214,
    prompt_token_overhead=4.75e-06, comm_efficiency=0.672, layer_overhead=1.03e-06,
    expert_overhead=2.22e-08, mla_layer_overhead=0.0, sequence_overhead=3.26e-05,
    vllm_version="0.11", fit="the calibrate tests' reference engine")
REFERENCE_HARDWARE = "ref-h100"  # its name in reference_catalog()


def reference_h100() -> Hardware:
    """The h100 preset with REFERENCE_CALIBRATION."""
    return replace(load_hardware("h100"), calibration=REFERENCE_CALIBRATION)


def reference_deployment() -> Deployment:
    """The calibrate tests' engine: llama-3.1-8b on one reference h100, 16-token blocks."""
    return Deployment(name="m", model=load_model("llama-3.1-8b"), hardware=reference_h100(),
                      scheduler=SchedulerConfig(block_size=16))


def reference_catalog(directory: Path) -> Path:
    """DIR/hardware/ref-h100.toml, the h100 preset with REFERENCE_CALIBRATION as its
    [calibration] (what `--catalog DIR --hardware ref-h100` fits from); returns DIR."""
    from inference_lab.calibrate.preset import write_preset

    write_preset(directory, REFERENCE_HARDWARE, Catalog().text("hardware", "h100"), "h100",
                 REFERENCE_CALIBRATION, ["the calibrate tests' reference engine"])
    return directory


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


def fixed_workload(path: Path, requests: int, prompt: int, output: int, users: int = 0) -> Path:
    """A workload file at `path`: `requests` requests of fixed prompt and output lengths,
    from `users` closed-loop clients (0: one batch), seed 1."""
    arrivals = (f'arrival_pattern = "closed_loop"\nnum_concurrent_users = {users}\n' if users
                else 'arrival_pattern = "batched"\n')
    path.write_text(f"{arrivals}num_requests = {requests}\nseed = 1\n"
                    f'input_len_dist = {{ type = "fixed", value = {prompt} }}\n'
                    f'output_len_dist = {{ type = "fixed", value = {output} }}\n')
    return path


def inline_model(weights: str, attention: str = "", hardware: str = "b200") -> str:
    """A deployment config with an inline 16-layer attention model (1024 wide): its one
    [[model.weights]] table holds `weights`, its [[model.layers]] table `attention` too."""
    return (f"[model]\nhidden_dim = 1024\nmax_seq_len = 4096\n[[model.weights]]\n{weights}"
            '[[model.layers]]\nkind = "attention"\ncount = 16\nheads = 16\nhead_dim = 64\n'
            f"kv_heads = 4\n{attention}[hardware.{hardware}]\n")


def calibrate_points(truth, noise=None):
    """The calibrate tests' measurements: a llama-3.1-8b engine on the reference h100
    timed by the calibration `truth`, 10 x c requests of 2048 / 64 tokens at 1, 8 and 64
    clients, each measured value rounded to 4 digits and scaled by the next factor of
    `noise` (1 + n)."""
    from inference_lab.calibrate.simulate import Point, simulate

    dep = reference_deployment()
    factors = iter(noise or [0.0] * 6)
    points = []
    for c in (1, 8, 64):
        point = Point(f"c={c}", dep, c, 2048, 64, {"ttft_ms": 1.0, "tpot_ms": 1.0}, requests=10 * c)
        sim = simulate(point, truth)
        points.append(replace(point, measured={k: round(sim[k] * (1 + next(factors)), 4)
                                               for k in ("ttft_ms", "tpot_ms")}))
    return points
