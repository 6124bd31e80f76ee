"""One experiment from scenario to report: run it (runner), write the records, ask the
oracle, summarise, draw the report. And `compare`: several run directories on one page.

Knows the order of those steps and the run directory's files. Does not start servers
(the CLI does) or know any step's internals.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

from inference_lab.experiments.controllers import make_controller
from inference_lab.experiments.oracle import oracles
from inference_lab.experiments.records import load_run
from inference_lab.experiments.report import write_comparison, write_report
from inference_lab.experiments.runner import Runner
from inference_lab.experiments.scenario import Scenario
from inference_lab.experiments.summary import summarise

__all__ = ["run_experiment", "analyse", "compare", "adapter_dirs"]


def adapter_dirs(scenario: Scenario, out: Path) -> dict[str, str]:
    """One directory per LoRA adapter of the load, under DIR/adapters, holding the
    adapter_config.json with the load's `lora_rank` (the only file the server reads of an
    adapter): for `serve --lora-modules` and POST /v1/load_lora_adapter."""
    paths = {}
    root = (out / "adapters").resolve()
    for name, _ in scenario.workload.lora_adapters:
        where = (root / name).resolve()
        if where.parent != root:  # (the workload's names are checked: common.workload)
            raise ValueError(f"adapter name {name!r} is not a plain directory name")
        where.mkdir(parents=True, exist_ok=True)
        (where / "adapter_config.json").write_text(json.dumps({"r": scenario.workload.lora_rank}))
        paths[name] = str(where.resolve())
    return paths


async def run_experiment(scenario: Scenario, base_url: str, out: Path, *, time_scale: float = 1.0,
                         metrics_url: str | None = None, api_key: str | None = None,
                         control_token: str | None = None,
                         on_progress: Callable[[str], None] | None = None) -> dict:
    """Run `scenario` against the server at `base_url`; write records, summary.json and
    report.html into `out`; return the summary."""
    controller = make_controller(scenario.controller, scenario.controller_params,
                                 seed=scenario.workload.seed)
    runner = Runner(scenario, base_url, controller, time_scale=time_scale,
                    metrics_url=metrics_url, api_key=api_key, control_token=control_token,
                    on_progress=on_progress, adapters=adapter_dirs(scenario, out))
    records = await runner.run()
    out.mkdir(parents=True, exist_ok=True)
    records.write(out)
    (out / "scenario.json").write_text(json.dumps({
        "path": scenario.path, "name": scenario.name, "controller": scenario.controller,
        "controller_params": scenario.controller_params, "time_scale": time_scale}, indent=1))
    return await asyncio.to_thread(analyse, scenario, out)


def analyse(scenario: Scenario, out: Path) -> dict:
    """summary.json and report.html from the records in `out` (re-runnable offline)."""
    run = load_run(out)
    summary = summarise(scenario, run, oracles(scenario), scenario.controller)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    write_report(out, run, summary, scenario.window)
    return summary


def compare(directories: list[Path], out: Path) -> Path:
    runs = []
    for d in directories:
        summary_path = d / "summary.json"
        if not summary_path.is_file():
            raise FileNotFoundError(f"{d}: no summary.json (not an experiment's output directory?)")
        summary = json.loads(summary_path.read_text())
        runs.append((f"{d.name}", load_run(d), summary))
    return write_comparison(out, runs, runs[0][2].get("window_s", 2.0))
