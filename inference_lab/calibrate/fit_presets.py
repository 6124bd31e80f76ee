"""Fit the bundled hardware presets' `calibrated` timing model to public measurements
and print the error table.

    python -m inference_lab.calibrate.fit_presets [--data DIR] [--hardware b200] [--jobs 2]
                                                  [--max-iter 12] [--report-only]

Reads every `inference_lab/calibrate/data/*.toml` (`DATA`, or --data DIR: a [source] with
its provenance, [[deployments]]
naming a bundled model and hardware preset with tp and scheduler settings, [[rows]] of
measured metrics at a concurrency and prompt / output lengths; `holdout = true` rows are
never seen by the fit), then per hardware:
1. simulates every row with the roofline (no calibration) for reference;
2. fits the hardware's [calibration] parameters to its non-held-out rows
   (inference_lab.calibrate.fitting: damped Gauss-Newton on log(simulated / measured),
   starting from the preset's own [calibration]), after dropping the parameters the rows
   cannot determine (named in the output);
3. prints, per row and metric: measured, roofline, calibrated, error; then the median and
   largest absolute error on the fit rows and on the held-out rows separately, per
   metric, and per source;
4. prints the [calibration] table to put in the hardware preset.
Row keys: input, output, concurrency, requests (default 10 x concurrency), range_ratio
(lengths uniform over [ratio x L, L]; default 1: fixed), holdout, deployment (when the
file has several), and the metrics in ms: ttft_ms, tpot_ms, e2e_ms (means), ttft_p50_ms,
tpot_p50_ms (medians). A source's `metrics` list names the ones compared (default: the
means present). Each row runs through the offline driver with closed-loop clients,
exactly as `inference-lab sim` would. `inference-lab calibrate` fits a user's own
measurements (inference_lab.cli.cmd_calibrate); this fits the presets that ship.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tomllib
from dataclasses import fields, replace
from pathlib import Path

from inference_lab.calibrate.fitting import PARAMETERS, PRIOR, Evaluator, fit, relative_errors
from inference_lab.calibrate.simulate import DEFAULT_MAX_REQUESTS, Point
from inference_lab.engine.sim import catalog, generations
from inference_lab.engine.sim.profiles import apply as apply_profile
from inference_lab.engine.sim.specs import Calibration, Deployment, SchedulerConfig

DATA = Path(__file__).resolve().parent / "data"  # the public measurements, each with its [source]
DEFAULT_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")
_SCHED_KEYS = ("max_num_seqs", "max_num_batched_tokens", "block_size", "enable_chunked_prefill",
               "enable_prefix_caching", "max_model_len", "kv_cache_dtype")


PROVENANCE = "inference_lab.calibrate.fit_presets"  # how a preset's `fit` names this fit


def load_rows(data_dir: Path = DATA) -> list[Point]:
    rows = []
    for path in sorted(data_dir.glob("*.toml")):
        data = tomllib.loads(path.read_text())
        source = data["source"]
        metrics = tuple(source.get("metrics", DEFAULT_METRICS))
        first_wave = source.get("first_wave") == "included"
        # the vLLM generation measured (engine.sim.generations): picks the preset's fit
        tags = {"vllm_version": source["vllm_version"]} if "vllm_version" in source else {}
        deployments = {}
        for d in data["deployments"]:
            explicit = {k: d[k] for k in _SCHED_KEYS if k in d}
            dep = Deployment(
                name=d["name"], model=catalog.load_model(d["model"]),
                hardware=catalog.load_hardware(d["hardware"]), tp=d.get("tp", 1),
                scheduler=SchedulerConfig(**explicit))
            if d.get("engine", "vllm") != "vllm":  # an engine profile, the row's settings on top
                dep = apply_profile(dep, d["engine"])
                dep = replace(dep, scheduler=replace(dep.scheduler, **explicit))
            deployments[d["name"]] = dep
        only = next(iter(deployments)) if len(deployments) == 1 else None
        for r in data["rows"]:
            dep = deployments[r.get("deployment", only)]
            measured = {key: r[key] for key in metrics if key in r}
            rows.append(Point(f"{dep.name} {r['input']}/{r['output']} c={r['concurrency']}", dep,
                              r["concurrency"], r["input"], r["output"], measured,
                              requests=r.get("requests", 0), range_ratio=r.get("range_ratio", 1.0),
                              first_wave=first_wave, holdout=r.get("holdout", False), source=path.stem,
                              tags=dict(tags)))
    return rows


def _summary(errors: dict[str, list[float]]) -> str:
    return "  ".join(f"{k} {statistics.median(v):5.1%} / {max(v):5.1%} ({len(v)})"
                     for k, v in sorted(errors.items()))


def report(hw: str, rows: list[Point], ev: Evaluator, cal: Calibration, roof: Evaluator) -> dict:
    """Print the per-row table; return |errors| by set and metric."""
    print(f"{'row':46s} {'metric':12s} {'measured':>9s} {'roofline':>9s} {'calibr.':>9s} {'error':>7s}  set")
    sims = ev.sims([cal])[0]
    roofs = roof.sims([None])[0] if roof is not None else [None] * len(rows)
    by_set: dict[str, dict[str, list[float]]] = {"fit": {}, "held-out": {}}
    by_source: dict[str, dict[str, list[float]]] = {}
    for row, sim, rs in zip(rows, sims, roofs):
        part = "held-out" if row.holdout else "fit"
        for key, err in relative_errors(row, sim).items():
            by_set[part].setdefault(key, []).append(abs(err))
            by_source.setdefault(f"{row.source} {part}", {}).setdefault(key, []).append(abs(err))
            r = f"{rs[key]:9.2f}" if rs else "        -"
            print(f"{row.label:46s} {key:12s} {row.measured[key]:9.2f} {r} {sim[key]:9.2f} "
                  f"{err:+7.1%}  {part}")
    print(f"-- {hw}: |error| median / max (count)")
    for part, errs in by_set.items():
        if errs:
            print(f"   {part:9s} {_summary(errs)}")
    for name, errs in sorted(by_source.items()):
        print(f"   {name:50s} {_summary(errs)}")
    return by_set


def _weight(text: str) -> float:
    """--prior's value: a number of 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a weight of 0 or more, got {text!r}")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m inference_lab.calibrate.fit_presets",
                                     description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--hardware", action="append", default=None,
                        help="fit only this hardware preset (repeatable)")
    parser.add_argument("--jobs", type=int, default=1, help="simulations in parallel processes")
    parser.add_argument("--max-iter", type=int, default=12, help="Gauss-Newton steps at most")
    parser.add_argument("--prior", type=_weight, default=PRIOR,
                        help=f"how strongly each parameter is held near its start (default {PRIOR}; 0: not)")
    parser.add_argument("--max-requests", type=int, default=DEFAULT_MAX_REQUESTS,
                        help="simulate at most this many requests per row (at least 4 x its "
                             "concurrency)")
    parser.add_argument("--params", default=",".join(PARAMETERS),
                        help="comma-separated [calibration] keys to fit (default: all)")
    parser.add_argument("--start", default="", metavar="KEY=VALUE,...",
                        help="start the fit from these [calibration] values instead of the preset's")
    parser.add_argument("--vllm-version", default="", metavar="VERSION",
                        help="fit only the rows of this vLLM generation (their source's "
                             "vllm_version), starting from the preset's fit of it "
                             "([calibration.generations.\"VERSION\"], else its [calibration])")
    parser.add_argument("--report-only", action="store_true",
                        help="no fit: the error table of the preset's current [calibration]")
    parser.add_argument("--no-roofline", action="store_true", help="leave the roofline column out")
    args = parser.parse_args()
    rows = [r for r in load_rows(args.data)
            if (args.hardware is None or r.deployment.hardware.name in args.hardware)
            and (not args.vllm_version or r.tags.get("vllm_version") == args.vllm_version)]
    by_hw: dict[str, list[Point]] = {}
    for row in rows:  # an engine profile's rows are fitted apart (hardware+engine)
        engine = row.deployment.scheduler.engine
        key = row.deployment.hardware.name + ("" if engine == "vllm" else f"+{engine}")
        by_hw.setdefault(key, []).append(row)
    names = [n.strip() for n in args.params.split(",") if n.strip()]
    for hw, hw_rows in sorted(by_hw.items()):
        hardware = catalog.load_hardware(hw.split("+")[0])
        own = generations.calibration_for(hardware, args.vllm_version) or hardware.calibration
        start = replace(own or Calibration(), transferred_from="", vllm_version=args.vllm_version
                        or (own.vllm_version if own else ""),
                        **{k: float(v) for k, v in (kv.split("=") for kv in args.start.split(",") if kv)})
        ev = Evaluator(hw_rows, args.max_requests, args.jobs)
        fit_idx = [i for i, r in enumerate(hw_rows) if not r.holdout]
        print(f"\n== {hw}: {len(fit_idx)} rows fitted, {len(hw_rows) - len(fit_idx)} held out", flush=True)
        if args.report_only:
            cal = start
        else:
            result = fit(ev, start, names, fit_idx, args.max_iter, log=lambda s: print(s, flush=True),
                         prior=args.prior)
            cal = result.calibration
            print(f"fitted: {', '.join(result.fitted)}; mean |error| on the fit rows "
                  f"{result.mean_abs_error:.1%} after {result.iterations} steps")
            for name, why in result.undetermined.items():
                print(f"not determined by these rows (kept at {getattr(cal, name):g}): {name}: {why}")
        roof = None if args.no_roofline else Evaluator(hw_rows, args.max_requests, args.jobs)
        report(hw, hw_rows, ev, cal, roof)
        table = f'calibration.generations."{args.vllm_version}"' if args.vllm_version else "calibration"
        print(f"[{table}]   # {hw}: {PROVENANCE} on "
              f"{' + '.join(sorted({r.source for r in hw_rows}))}")
        for f in fields(Calibration):
            if f.name in PARAMETERS and getattr(cal, f.name) is not None:  # None: unset
                print(f"{f.name} = {float(f'{getattr(cal, f.name):.3g}'):g}")
        if cal.memory_reserve:  # set from the pool's plateaus (benchmarks/memory_reserve.py)
            print(f"memory_reserve = {cal.memory_reserve:g}")
        if cal.vllm_version:
            print(f'vllm_version = "{cal.vllm_version}"')
    return 0


if __name__ == "__main__":
    sys.exit(main())
