"""One experiment from scenario to report: run it (runner), write the records, ask the
oracle, summarise, draw the report. And `compare`: several run directories on one page.

`run_experiment` drives a served lab over HTTP; `run_virtual` runs the same scenario on
a simulated clock against a simulated fleet (experiments.virtual), writing the same
files. A P/D fleet's run (`[fleet] kv_roles`) gets its P/D summary; a sweep of ratios
runs once per ratio (`pd_run_dir`) and `pd_sweep` puts them on one page. A fleet's run
also gets the autoscaler (inference_lab.autoscale) and the
autoscaling summary with its oracle (experiments.autoscaling).

Knows the order of those steps and the run directory's files. Does not start servers
(the CLI does) or know any step's internals.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from inference_lab.autoscale.capacity import Slo, lengths_of, replica_capacity, with_capacity
from inference_lab.autoscale.registry import make_autoscaler
from inference_lab.common.reading import loads, read_text
from inference_lab.engine.fleet.startup import startup_delay
from inference_lab.experiments.autoscaling import fleet_summary
from inference_lab.experiments.controllers import make_controller
from inference_lab.experiments.oracle import deployment_for, oracles
from inference_lab.experiments.records import RunFileError, load_run
from inference_lab.experiments.report import write_comparison, write_pd_sweep, write_report
from inference_lab.experiments.runner import Runner
from inference_lab.experiments.scenario import Scenario
from inference_lab.experiments.summary import pd_summary, summarise

__all__ = ["run_experiment", "run_virtual", "analyse", "compare", "adapter_dirs", "pd_sweep",
           "pd_run_dir",
           "replica_startup_delay", "capacity_of", "VIRTUAL_FAULTS"]

VIRTUAL_FAULTS = ("slow", "clear")  # the faults virtual time models


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


def replica_startup_delay(scenario: Scenario) -> float:
    """A new replica's start-up delay in modelled seconds (the fleet's setting; none for a
    P/D fleet, which never scales)."""
    fleet = scenario.fleet
    if scenario.ratios:
        return 0.0
    return startup_delay(deployment_for(scenario), fleet.startup_delay) if fleet else 0.0


_capacities: dict[tuple, float] = {}


def capacity_of(scenario: Scenario) -> float | None:
    """Requests/s one replica serves at the scenario's SLO (the capacity model), or None
    without an [slo]. Computed once per scenario in a process."""
    if scenario.slo is None:
        return None
    dep = with_capacity(deployment_for(scenario), scenario.max_num_seqs, scenario.max_waiting)
    slo = Slo(scenario.slo.ttft_s, scenario.slo.e2e_s, scenario.slo.attainment)
    key = (scenario.path, scenario.model, scenario.hardware, scenario.max_num_seqs,
           scenario.max_waiting, slo, scenario.workload)
    if key not in _capacities:
        _capacities[key] = replica_capacity(dep, lengths_of(scenario.workload, scenario.workload.seed), slo)
    return _capacities[key]


def _autoscaler(scenario: Scenario):
    if not scenario.autoscaler:
        return None
    params = dict(scenario.autoscaler_params)
    if scenario.autoscaler in ("hpa", "slo"):
        params.setdefault("max_replicas", scenario.fleet.max_replicas)
    elif scenario.autoscaler == "keda":
        params.setdefault("max_replica_count", scenario.fleet.max_replicas)

    def capacity() -> float:
        rps = capacity_of(scenario)
        if rps is None:
            raise ValueError("the slo autoscaler needs the scenario's [slo] (or capacity_rps)")
        return rps

    return make_autoscaler(scenario.autoscaler, params, capacity)


async def _run(scenario: Scenario, base_url: str, out: Path, *, time_scale: float = 1.0,
               metrics_url: str | None = None, api_key: str | None = None,
               control_token: str | None = None, on_progress: Callable[[str], None] | None = None,
               backend=None) -> None:
    controller = make_controller(scenario.controller, scenario.controller_params,
                                 seed=scenario.workload.seed)
    runner = Runner(scenario, base_url, controller, time_scale=time_scale,
                    metrics_url=metrics_url, api_key=api_key, control_token=control_token,
                    on_progress=on_progress, adapters=adapter_dirs(scenario, out),
                    backend=backend, autoscaler=_autoscaler(scenario))
    records = await runner.run()
    out.mkdir(parents=True, exist_ok=True)
    records.write(out)
    (out / "scenario.json").write_text(json.dumps({
        "path": scenario.path, "name": scenario.name, "controller": scenario.controller,
        "controller_params": scenario.controller_params, "time_scale": time_scale,
        "virtual": backend is not None and backend.virtual,
        "autoscaler": scenario.autoscaler, "autoscaler_params": scenario.autoscaler_params},
        indent=1, default=str))


async def run_experiment(scenario: Scenario, base_url: str, out: Path, *, time_scale: float = 1.0,
                         metrics_url: str | None = None, api_key: str | None = None,
                         control_token: str | None = None,
                         on_progress: Callable[[str], None] | None = None) -> dict:
    """Run `scenario` against the server at `base_url`; write records, summary.json and
    report.html into `out`; return the summary."""
    await _run(scenario, base_url, out, time_scale=time_scale, metrics_url=metrics_url,
               api_key=api_key, control_token=control_token, on_progress=on_progress)
    return await asyncio.to_thread(analyse, scenario, out)


def run_virtual(scenario: Scenario, out: Path,
                on_progress: Callable[[str], None] | None = None) -> dict:
    """Run `scenario` on the simulated clock (no server, no wall-clock pacing); the same
    files as run_experiment, plus virtual_run.json (`wall_s`, `cpu_s`, `speed`: modelled
    seconds per wall second, `engine_steps`; with data-parallel ranks `data_parallel`,
    each replica's ranks as `sim` reports them), which summary.json repeats."""
    from inference_lab.experiments.virtual import VirtualBackend, VirtualLab, VirtualLoop

    if scenario.ratios:
        raise ValueError(f"{scenario.path}: fleet.kv_roles: virtual time does not model a P/D "
                         "fleet (run it with --serve or --url)")
    for action in scenario.timeline:
        kind = action.fault.get("kind") if action.fault else None
        of = action.fault["of"]["kind"] if kind == "end" else kind
        if of is not None and of not in VIRTUAL_FAULTS:
            raise ValueError(f"{scenario.path}: a {of!r} fault at {action.at:g} s is not modelled "
                             f"in virtual time (only {', '.join(VIRTUAL_FAULTS)})")
    dep = deployment_for(scenario)
    # a new replica starts as a served one does: the config's max_num_seqs, the scenario's
    # max_waiting (what --serve passes), until the runner gives it the scenario's capacity
    dep = replace(dep, scheduler=replace(dep.scheduler, max_waiting=scenario.max_waiting))
    delay = replica_startup_delay(scenario)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    with asyncio.Runner(loop_factory=VirtualLoop) as runner:
        lab = VirtualLab(runner.get_loop(), dep,
                         replicas=scenario.fleet.replicas if scenario.fleet else 1,
                         startup_delay=delay, max_loras=scenario.workload.max_loras,
                         data_parallel_size=scenario.data_parallel_size)
        runner.run(_run(scenario, "", out, on_progress=on_progress, backend=VirtualBackend(lab)))
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    run = {"wall_s": wall, "cpu_s": cpu, "speed": scenario.duration / wall if wall else None,
           "engine_steps": lab.steps}
    if scenario.data_parallel_size > 1:  # the ranks of the replicas up at the end
        run["data_parallel"] = {str(i): r.dp.summary() for i, r in sorted(lab.replicas.items())}
    (out / "virtual_run.json").write_text(json.dumps(run, indent=1))
    return analyse(scenario, out)


def _fleet_oracles(scenario: Scenario) -> list[dict]:
    """A fleet's phases carry no single-replica oracle (the autoscaling section has its own)."""
    blank = {"kind": "fleet", "concurrency": None, "goodput_tok_s": None, "requests_per_s": None,
             "e2e_p50_s": None, "e2e_p99_s": None, "ttft_p50_s": None, "ttft_p99_s": None,
             "e2e_mean_s": None, "cache_hit_rate": None, "fault": "", "fault_modelled": True}
    return [dict(blank) for _ in scenario.phases()]


def analyse(scenario: Scenario, out: Path) -> dict:
    """summary.json and report.html from the records in `out` (re-runnable offline)."""
    run = load_run(out)
    pd = bool(scenario.ratios)
    fleet = scenario.fleet is not None
    summary = summarise(scenario, run, _fleet_oracles(scenario) if fleet else oracles(scenario),
                        scenario.controller)
    if pd:
        summary["pd"] = pd_summary(run)
    elif fleet:
        gpus = scenario.fleet.gpus_per_replica or deployment_for(scenario).tp
        summary["autoscaler"] = scenario.autoscaler or None
        summary["autoscaling"] = fleet_summary(scenario, run, gpus, capacity_of(scenario))
        summary["autoscaling"]["startup_delay_s"] = replica_startup_delay(scenario)
    summary["virtual"] = bool(run.get("virtual"))
    if (out / "virtual_run.json").is_file():
        summary["virtual_run"] = json.loads((out / "virtual_run.json").read_text())
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    write_report(out, run, summary, scenario.window)
    return summary


def compare(directories: list[Path], out: Path) -> Path:
    runs = []
    for d in directories:
        summary_path = d / "summary.json"
        if not summary_path.is_file():
            raise FileNotFoundError(f"{d}: no summary.json (not an experiment's output directory?)")
        summary = loads(read_text(summary_path, RunFileError), str(summary_path), RunFileError)
        if not isinstance(summary, dict):
            raise RunFileError(f"{summary_path}: expected a JSON object")
        runs.append((f"{d.name}", load_run(d), summary))
    return write_comparison(out, runs, runs[0][2].get("window_s", 2.0))


def pd_run_dir(out: Path, ratio: tuple[int, int]) -> Path:
    """Where a sweep's run of one P:D ratio goes."""
    return out / f"pd-{ratio[0]}-{ratio[1]}"


def pd_sweep(scenario: Scenario, out: Path) -> dict:
    """summary.json ({"pd_sweep": each ratio's P/D summary}) and report.html over the runs
    of a sweep of P:D ratios, from their directories (pd_run_dir)."""
    rows, dirs = [], []
    for ratio in scenario.ratios:
        d = pd_run_dir(out, ratio)
        rows.append(json.loads((d / "summary.json").read_text())["pd"])
        dirs.append(d.name)
    summary = {"scenario": scenario.name, "description": scenario.description,
               "pd_sweep": rows, "runs": dirs}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    write_pd_sweep(out, scenario.name, scenario.description, rows, dirs)
    return summary
