"""`inference-lab calibrate`: fit the calibrated timing model to your own measurements."""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from inference_lab.cli import UsageError
from inference_lab.cli.catalog_flags import KV_CACHE_DTYPE_CHOICES, add_catalog_argument, build_catalog
from inference_lab.cli.flag_types import number, positive_int

HELP = """\
Fit the `calibrated` timing model to measurements of your own deployment, and write a
hardware preset that carries the fit: DIR/hardware/NAME.toml, a copy of the --hardware
preset with the fitted [calibration]. Then

  inference-lab sim --catalog DIR --config my.toml --hardware NAME --timing calibrated ...

(with a [hardware.NAME] entry in my.toml) behaves like the measured deployment.

MEASUREMENTS are closed-loop runs (a fixed number of clients, each sending its next
request when the last one ends), one point each:
  - CSV with the header  concurrency,input_len,output_len,ttft_ms,tpot_ms
    (optional columns num_prompts and ttft_p50_ms, the median TTFT; mean lengths, TTFT
    and TPOT means in ms; TPOT = time per output token after the first);
  - the JSON of `vllm bench serve --save-result` (with --max-concurrency);
  - inference-perf reports (summary_ or stage_N_lifecycle_metrics.json of a
    concurrency stage), aiperf's profile_export_aiperf.json (--concurrency),
    guidellm's report JSON (synchronous or concurrent benchmarks).
A file's median TTFT is fitted when it has one, else its mean; TPOT is the mean. Each
point is simulated as `sim` would run it: the same clients, prompts and lengths, the
scheduler settings given here (as the measured server ran: pass what it was started
with). The fit starts from the hardware preset's own [calibration] and moves
--fit's parameters (damped Gauss-Newton on log(simulated / measured), each held near
its start by a weak prior, --prior); it refuses to
fit more parameters than measured values allow, and names the parameters the points
could not determine (those keep their starting values). It prints the fit per point
and each point's leave-one-out error: the error of a fit made without it, the best
guide to what the preset will do on loads you did not measure; and the extrapolation
error: the error at the largest concurrency of a fit made without it.

It judges its own fit: when the mean |error| on its own points is above
--max-fit-error (default 0.25), it prints the likely causes it recognises (TTFT
medians given in the ttft_ms column instead of ttft_p50_ms, random lengths taken as
exact without --range-ratio, an opening burst, a TPOT that does not fit) and writes
nothing (exit status 1) unless --force.

example:
  inference-lab calibrate sweep.csv --model gpt-oss-120b --hardware b200 \\
      --max-num-seqs 512 --no-prefix-caching --name my-b200 -o my-catalog
"""

DEFAULT_FIT = ("bandwidth_efficiency", "flops_efficiency", "step_overhead", "sequence_overhead",
               "request_overhead")
GENERIC_START = dict(flops_efficiency=0.5, flops_half_tokens=64.0, bandwidth_efficiency=0.7,
                     comm_efficiency=0.5, step_overhead=1e-3, request_overhead=5e-3)


def register(subparsers: argparse._SubParsersAction) -> None:
    from inference_lab.calibrate.fitting import PARAMETERS, PRIOR
    from inference_lab.calibrate.judgement import MAX_FIT_ERROR

    p = subparsers.add_parser(
        "calibrate", help="fit the calibrated timing model to your measurements; write a preset",
        description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("measurements", nargs="+", type=Path, metavar="MEASUREMENTS",
                   help="result files: CSV, vllm bench serve, inference-perf, aiperf or guidellm JSON")
    p.add_argument("--model", required=True, help="the served model: a catalog model preset")
    p.add_argument("--hardware", required=True,
                   help="the GPU: a catalog hardware preset (the copy's base and the fit's start)")
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel GPUs (default 1)")
    p.add_argument("--max-num-seqs", type=positive_int, default=None,
                   help="the server's max_num_seqs (default 256)")
    p.add_argument("--max-num-batched-tokens", type=positive_int, default=None,
                   help="the server's max_num_batched_tokens (default 8192)")
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPE_CHOICES, default="auto",
                   help="the server's --kv-cache-dtype (default auto: the model's precision)")
    p.add_argument("--no-prefix-caching", action="store_true",
                   help="the server ran with prefix caching off (vLLM's --no-enable-prefix-caching)")
    p.add_argument("--max-model-len", type=positive_int, default=None,
                   help="the server's max_model_len (default: the model's)")
    p.add_argument("--gpu-memory-utilization", type=number(float, lambda v: 0 < v <= 1, "a number in (0, 1]"),
                   default=None, metavar="FRACTION",
                   help="the server's --gpu-memory-utilization (default 0.9)")
    p.add_argument("--kv-cache-memory-bytes", type=positive_int, default=None, metavar="BYTES",
                   help="the server's KV cache per GPU in bytes (vLLM's --kv-cache-memory-bytes, or "
                        "the 'Available KV cache memory' it logs at start); replaces the pool's "
                        "arithmetic (HBM x utilization - weights - the preset's memory_reserve)")
    p.add_argument("--range-ratio", type=number(float, lambda v: 0 < v <= 1, "a number in (0, 1]"),
                   default=1.0,
                   help="lengths drawn uniformly from [ratio x L, L] with the files' mean "
                        "lengths as their mean, as vllm bench --random-range-ratio draws them "
                        "(default 1: every request at the mean lengths)")
    p.add_argument("--check", nargs="+", type=Path, default=[], metavar="FILE",
                   help="more measurements of the same deployment, never fitted: their error "
                        "under the fit is printed apart (a held-out check)")
    p.add_argument("--name", required=True, help="the new hardware preset's name (file stem)")
    p.add_argument("-o", "--output", required=True, type=Path, metavar="DIR",
                   help="catalog directory to write DIR/hardware/NAME.toml into")
    p.add_argument("--fit", default=",".join(DEFAULT_FIT), metavar="PARAMS",
                   help="comma-separated [calibration] keys to fit (default: "
                        f"{','.join(DEFAULT_FIT)}; any of {', '.join(PARAMETERS)})")
    p.add_argument("--max-iter", type=positive_int, default=10, help="fit steps at most (default 10)")
    p.add_argument("--prior", type=number(float, lambda v: v >= 0, "a weight of 0 or more"),
                   default=PRIOR, metavar="WEIGHT",
                   help="how strongly each fitted parameter is held near its start value, so that "
                        "a few points do not trade one parameter for another along a direction "
                        f"they cannot tell apart (default {PRIOR}: doubling a parameter costs what "
                        "a 5%% error on one measured value does; 0: no hold)")
    p.add_argument("--max-fit-error", type=number(float, lambda v: v > 0, "a positive fraction"),
                   default=MAX_FIT_ERROR, metavar="FRACTION",
                   help="the mean |simulated / measured - 1| on the fit's own points above which "
                        f"no preset is written (default {MAX_FIT_ERROR}: {100 * MAX_FIT_ERROR:.0f}%%)")
    p.add_argument("--force", action="store_true",
                   help="write the preset even when the fit's error is above --max-fit-error")
    p.add_argument("--jobs", type=positive_int, default=1,
                   help="simulations in parallel processes (default 1)")
    add_catalog_argument(p)
    p.set_defaults(func=run)


def _deployment(args: argparse.Namespace, cat):
    from dataclasses import replace

    from inference_lab.common.toml import ConfigError
    from inference_lab.engine.sim import kv
    from inference_lab.engine.sim.specs import Deployment, SchedulerConfig

    try:
        model, hardware = cat.load_model(args.model), cat.load_hardware(args.hardware)
    except ConfigError as exc:
        raise UsageError(exc.message) from None
    sched = {"kv_cache_dtype": args.kv_cache_dtype, "enable_prefix_caching": not args.no_prefix_caching}
    if args.max_num_seqs is not None:
        sched["max_num_seqs"] = args.max_num_seqs
    if args.max_num_batched_tokens is not None:
        sched["max_num_batched_tokens"] = args.max_num_batched_tokens
    if args.max_model_len is not None:
        if args.max_model_len > model.max_seq_len:
            raise UsageError(f"--max-model-len {args.max_model_len}: more than {model.name}'s "
                             f"{model.max_seq_len}")
        sched["max_model_len"] = args.max_model_len
    if args.gpu_memory_utilization is not None:
        sched["gpu_memory_utilization"] = args.gpu_memory_utilization
    if args.kv_cache_memory_bytes is not None:  # per GPU, as vLLM's flag; the lab's is the group's
        sched["kv_cache_capacity"] = args.kv_cache_memory_bytes * args.tp
    scheduler = SchedulerConfig(**sched)
    if scheduler.max_num_batched_tokens < scheduler.max_num_seqs:
        raise UsageError(f"--max-num-batched-tokens {scheduler.max_num_batched_tokens} is below "
                         f"max_num_seqs {scheduler.max_num_seqs}")
    if args.tp > 1 and not hardware.link_bandwidth:
        raise UsageError(f"--tp {args.tp} needs a [fabric] on {hardware.name}, which has none")
    dep = Deployment(name=model.name, model=model, hardware=hardware, tp=args.tp, scheduler=scheduler)
    if kv.total_blocks(dep) == 0:
        raise UsageError(f"{model.name} leaves no KV cache room on {args.tp} x {hardware.name}: raise --tp")
    if hardware.calibration is not None and kv.total_blocks(replace(dep, timing="calibrated")) == 0:
        raise UsageError(f"{model.name} and the {hardware.name} preset's memory_reserve "
                         f"({hardware.calibration.memory_reserve / 1e9:.3g} GB per GPU) leave no KV cache "
                         f"room on {args.tp} x {hardware.name}: raise --tp, or give the server's "
                         "--kv-cache-memory-bytes")
    return dep


def _points(args: argparse.Namespace, dep, files: list[Path]):
    from inference_lab.calibrate.measurements import MeasurementError, read_measurements
    from inference_lab.calibrate.simulate import Point

    try:
        found = read_measurements(files)
    except MeasurementError as exc:
        raise UsageError(str(exc)) from None
    limit = dep.scheduler.max_model_len or dep.model.max_seq_len
    points = []
    for m in found:
        # uniform over [r L, L] has the mean (1 + r) L / 2: L from the measured mean
        top = [max(2, round(2 * n / (1 + args.range_ratio))) for n in (m.input_len, m.output_len)]
        if top[0] + top[1] > limit:
            raise UsageError(f"{m.where}: requests of up to {top[0]} + {top[1]} tokens exceed the "
                             f"model length {limit} (--max-model-len)")
        points.append(Point(f"c={m.concurrency} {m.input_len}/{m.output_len}", dep, m.concurrency,
                            top[0], top[1], dict(m.metrics), requests=m.num_prompts,
                            range_ratio=args.range_ratio, source=m.where))
    return points


def _fit_names(args: argparse.Namespace) -> list[str]:
    from inference_lab.calibrate.fitting import PARAMETERS

    names = [n.strip() for n in args.fit.split(",") if n.strip()]
    unknown = [n for n in names if n not in PARAMETERS]
    if unknown or not names:
        raise UsageError(f"--fit: unknown parameter(s) {', '.join(unknown) or '(none given)'}; "
                         f"known: {', '.join(PARAMETERS)}")
    return list(dict.fromkeys(names))


def _pct(x: float) -> str:
    return f"{x:+6.1%}"


def _report_checks(checks, calibration) -> None:
    """The held-out points' errors under the fit, per point and per metric."""
    from inference_lab.calibrate.fitting import Evaluator, relative_errors

    sims = Evaluator(checks).sims([calibration])[0]
    print(f"\nheld out (--check, not fitted):\n{'point':28s} {'metric':12s} {'measured':>9s} "
          f"{'predicted':>9s} {'error':>7s}")
    by_metric: dict[str, list[float]] = {}
    for p, sim in zip(checks, sims):
        for key, err in relative_errors(p, sim).items():
            by_metric.setdefault(key, []).append(abs(err))
            print(f"{p.label:28s} {key:12s} {p.measured[key]:9.2f} {sim[key]:9.2f} {_pct(err)}")
    print("held out: " + "; ".join(f"{k} median |error| {statistics.median(v):.1%}, max {max(v):.1%}"
                                   for k, v in sorted(by_metric.items())))


def _report_fit(points, sims, loo, error: float) -> None:
    """Each fit point's metrics: measured, fitted, error, leave-one-out error."""
    from inference_lab.calibrate.fitting import relative_errors

    print(f"\n{'point':28s} {'metric':12s} {'measured':>9s} {'fitted':>9s} {'error':>7s} {'leave-one-out':>13s}")
    for i, (p, sim) in enumerate(zip(points, sims)):
        for key, err in relative_errors(p, sim).items():
            out = _pct(loo[i][key]) if i in loo else "     -"
            print(f"{p.label:28s} {key:12s} {p.measured[key]:9.2f} {sim[key]:9.2f} {_pct(err)} {out:>13s}")
    errs = [abs(e) for p, sim in zip(points, sims) for e in relative_errors(p, sim).values()]
    print(f"\nfit: mean |error| {error:.1%}, median {statistics.median(errs):.1%}, max {max(errs):.1%}")


def _extrapolation(points, errors: dict[int, dict[str, float]] | None) -> str:
    """One line: the largest concurrency's errors under a fit made without it (per
    metric, the largest in size when several points share that concurrency)."""
    if not errors:
        return ""
    worst: dict[str, float] = {}
    for e in errors.values():
        for key, x in e.items():
            if abs(x) >= abs(worst.get(key, 0.0)):
                worst[key] = x
    top = points[next(iter(errors))].concurrency
    below = sorted({p.concurrency for p in points if p.concurrency < top})
    return (f"extrapolation error (c={top} predicted by a fit on c={','.join(map(str, below))}): "
            + ", ".join(f"{k} {x:+.1%}" for k, x in sorted(worst.items())))


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from inference_lab.calibrate.fitting import Evaluator, applicable, fit, leave_largest_out, leave_one_out
    from inference_lab.calibrate.judgement import fit_error, likely_causes
    from inference_lab.calibrate.preset import NAME, write_preset
    from inference_lab.engine.sim.specs import Calibration

    if not NAME.match(args.name):
        raise UsageError(f"--name {args.name!r}: expected a lower-case file stem (letters, digits, "
                         "'.', '_', '-')")
    cat = build_catalog(args)
    dep = _deployment(args, cat)
    points = _points(args, dep, args.measurements)
    checks = _points(args, dep, args.check) if args.check else []
    names, why_not = applicable(points, _fit_names(args))
    values = sum(len(p.measured) for p in points)
    if values <= len(names) or len(points) < 2:
        raise UsageError(f"{len(points)} point(s) give {values} measured values; fitting "
                         f"{len(names)} parameter(s) ({', '.join(names)}) needs at least "
                         f"{len(names) + 1} values from 2 or more points: give more points or fewer "
                         "--fit parameters")
    start = dep.hardware.calibration or Calibration(**GENERIC_START)
    start = replace(start, transferred_from="")
    ev = Evaluator(points, jobs=args.jobs)
    idx = list(range(len(points)))
    print(f"fitting {', '.join(names)} to {len(points)} points ({values} values) of {dep.model.name} "
          f"on {args.tp} x {dep.hardware.name}, from the {dep.hardware.name} preset's "
          f"{'[calibration]' if dep.hardware.calibration else 'generic start (it has no [calibration])'}",
          flush=True)
    result = fit(ev, start, names, idx, args.max_iter, log=lambda s: print(s, flush=True),
                 prior=args.prior)
    for name, why in {**why_not, **result.undetermined}.items():
        print(f"not determined: {name} (kept at {getattr(result.calibration, name):g}): {why}")
    sims = ev.sims([result.calibration])[0]
    error = fit_error(points, sims)
    refused = error > args.max_fit_error and not args.force
    # a refused fit is not refitted: leave-one-out would only say how it misses
    loo = leave_one_out(ev, result, idx) if len(points) > 2 and result.fitted and not refused else {}
    extrapolation = leave_largest_out(ev, result, idx, loo) if loo else None
    _report_fit(points, sims, loo, error)
    verdict = ""
    if error > args.max_fit_error:
        verdict = (f"the fit's mean |error| on its own points is {error:.1%}, above "
                   f"{args.max_fit_error:.0%} (--max-fit-error)")
        causes = likely_causes(points, sims, args.max_fit_error)
        lines = "likely causes:\n" + "\n".join(f"  - {c}" for c in causes)
        if refused:
            print(f"inference-lab calibrate: error: {verdict}; wrote nothing.\n{lines}\n"
                  "Correct the measurements or flags and run again, or pass --force to write the "
                  "preset anyway.", file=sys.stderr)
            return 1
        print(f"warning: {verdict}; writing the preset anyway (--force).\n{lines}", file=sys.stderr)
    if checks:
        _report_checks(checks, result.calibration)
    if loo:
        by_metric: dict[str, list[float]] = {}
        for errors in loo.values():
            for key, e in errors.items():
                by_metric.setdefault(key, []).append(abs(e))
        print("leave-one-out: " + "; ".join(f"{k} median |error| {statistics.median(v):.1%}, max "
                                             f"{max(v):.1%}" for k, v in sorted(by_metric.items())))
    extrapolated = _extrapolation(points, extrapolation)
    if extrapolated:
        print(extrapolated)
    files = ", ".join(sorted({str(f.name) for f in args.measurements}))
    cal = replace(result.calibration, fit=f"inference-lab calibrate on {files} ({len(points)} points; "
                  f"{dep.model.name}, tp {args.tp}; fitted: {', '.join(result.fitted) or 'none'})")
    settings = (f"max_num_seqs {dep.scheduler.max_num_seqs}, max_num_batched_tokens "
                f"{dep.scheduler.max_num_batched_tokens}, kv_cache_dtype {dep.scheduler.kv_cache_dtype}, "
                f"prefix caching {'on' if dep.scheduler.enable_prefix_caching else 'off'}")
    comment = [f"The `calibrated` timing model fitted by inference-lab calibrate to {len(points)} "
               f"measured points", f"({files}) of {dep.model.name} on {args.tp} x {dep.hardware.name}, "
               f"{settings}.", f"Fitted: {', '.join(result.fitted) or 'none'}; the rest kept from "
               f"the {dep.hardware.name} preset.",
               f"Mean |error| on these points {error:.1%}" + (f"; {extrapolated}." if extrapolated else ".")]
    if verdict:
        comment.append(f"Written with --force: {verdict}.")
    path = write_preset(args.output, args.name, cat.text("hardware", args.hardware), dep.hardware.name,
                        cal, comment)
    print(f"\nwrote {path}\nuse it: inference-lab sim --catalog {args.output} --hardware {args.name} "
          f"--timing calibrated --config CONFIG (with a [hardware.{args.name}] entry) ...")
    return 0
