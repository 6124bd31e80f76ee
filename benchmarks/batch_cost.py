"""Timing past the rows it was fitted on: how the calibrated presets extrapolate in load.

    python benchmarks/batch_cost.py [--hardware b200 ...] [--model gpt-oss-120b ...]
                                    [--vllm-version 0.22] [--data DIR] [--jobs 1]
                                    [--max-requests 640] [--fit-iter 6] [--split 32]

Per shipped GPU (b200, h200, h100) and per model, with each row timed by the preset's
fit of the row's vLLM generation (`vllm_version` of the data file's [source];
engine.sim.generations; the preset's own [calibration] when it has no fit of that
generation): the held-out TPOT median and largest |error|, the held-out TTFT median
|error|. Then per sweep (one deployment at one prompt / output shape, four or more
concurrencies, any row set): the signed TPOT error at its highest concurrency and at its
middle one (and, over the vLLM sweeps of the sources the fits use, the median of each),
and the TPOT error at the top rows (concurrency above --split) of a fit made
on the lower rows only (at most --split, three or more): `inference-lab calibrate`'s
default parameters, started from the shipped fit, as a user with a partial sweep would
run it. Every figure is printed with its target from docs/timing.md. No shipped
preset is changed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing_error import add_row_arguments, calibration_of, row_set, shipped_sims  # noqa: E402

from inference_lab.calibrate.fit_presets import load_rows  # noqa: E402
from inference_lab.calibrate.fitting import Evaluator, fit, relative_errors  # noqa: E402
from inference_lab.calibrate.simulate import Point  # noqa: E402
from inference_lab.cli.cmd_calibrate import DEFAULT_FIT  # noqa: E402
from inference_lab.engine.sim import catalog, generations  # noqa: E402

TARGETS = {"tpot_median": 0.10, "tpot_max": 0.20, "ttft_median": 0.25, "extrapolation": 0.15}


def held_out_summary(rows: list[Point], sims: list[dict]) -> None:
    by_model: dict[str, dict[str, list[float]]] = {}
    for row, sim in zip(rows, sims):
        if row_set(row, calibration_of(row).fit) != "held out":
            continue
        errs = by_model.setdefault(f"{row.deployment.model.name} (vLLM "
                                   f"{calibration_of(row).vllm_version or '?'})", {})
        for key, err in relative_errors(row, sim).items():
            errs.setdefault(key.split("_")[0], []).append(abs(err))
    print("| model (fit) | held-out TPOT median / max | held-out TTFT median | targets 10 % / 20 % / 25 % |")
    print("|---|---|---|---|")
    for model, errs in sorted(by_model.items()):
        tp, tt = errs.get("tpot", []), errs.get("ttft", [])
        if not tp and not tt:
            print(f"| {model} | - | - | no held-out TPOT or TTFT (end to end only) |")
            continue
        ok = (tp and statistics.median(tp) <= TARGETS["tpot_median"] and max(tp) <= TARGETS["tpot_max"]
              and (not tt or statistics.median(tt) <= TARGETS["ttft_median"]))
        tps = f"{statistics.median(tp):.1%} / {max(tp):.1%} ({len(tp)})" if tp else "-"
        tts = f"{statistics.median(tt):.1%} ({len(tt)})" if tt else "-"
        print(f"| {model} | {tps} | {tts} | {'met' if ok else 'missed'} |")


def sweeps(rows: list[Point]) -> dict[str, list[int]]:
    """Series label -> indices of its rows, by concurrency; sweeps of 4+ points only. A
    sweep is one source's model at one TP degree and prompt / output shape (its rows may
    be deployments of their own, as InferenceMAX's H100 runs with max_num_seqs = clients)."""
    out: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        d = r.deployment
        out.setdefault(f"{r.source}: {d.model.name} TP {d.tp} {r.input_len}/{r.output_len}", []).append(i)
    return {k: sorted(v, key=lambda i: rows[i].concurrency) for k, v in out.items()
            if len({rows[i].concurrency for i in v}) >= 4 and all("tpot_ms" in rows[i].measured for i in v)}


def tpot_err(row: Point, sim: dict) -> float:
    return sim["tpot_ms"] / row.measured["tpot_ms"] - 1.0


def extrapolation(ev: Evaluator, rows: list[Point], sims: list[dict], split: int, fit_iter: int) -> None:
    print(f"| sweep | TPOT error at the middle / highest concurrency | |highest| <= |middle| | "
          f"fit on c <= {split} -> TPOT error at the top (target within 15 %) |")
    print("|---|---|---|---|")
    fitted_mid, fitted_top = [], []
    for label, idx in sweeps(rows).items():
        mid, top = idx[(len(idx) - 1) // 2], idx[-1]
        e_mid, e_top = tpot_err(rows[mid], sims[mid]), tpot_err(rows[top], sims[top])
        low = [i for i in idx if rows[i].concurrency <= split]
        high = [i for i in idx if rows[i].concurrency > split]
        extra = "-"
        if len(low) >= 3 and high:
            result = fit(ev, calibration_of(rows[low[0]]), DEFAULT_FIT, low, fit_iter)
            preds = ev.sims([result.calibration], high)[0]
            extra = ", ".join(f"c={rows[i].concurrency} {tpot_err(rows[i], s):+.1%}" for i, s in zip(high, preds))
        if row_set(rows[top], calibration_of(rows[top]).fit) == "not fitted":
            label += " (a source the fit does not use)"
        elif rows[top].deployment.scheduler.engine == "vllm":
            fitted_mid.append(abs(e_mid))
            fitted_top.append(abs(e_top))
        print(f"| {label} | c={rows[mid].concurrency} {e_mid:+.1%} / c={rows[top].concurrency} {e_top:+.1%} "
              f"| {'yes' if abs(e_top) <= abs(e_mid) else 'no'} | {extra} |", flush=True)
    if fitted_top:
        top_med, mid_med = statistics.median(fitted_top), statistics.median(fitted_mid)
        print(f"\nOver the {len(fitted_top)} vLLM sweeps the fits use: TPOT |error| at the highest "
              f"concurrency {top_med:.1%} at the median, at the middle one {mid_med:.1%} "
              f"({'no larger' if top_med <= mid_med else 'larger'}); the top the larger on "
              f"{sum(t > m for t, m in zip(fitted_top, fitted_mid))} of them.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_row_arguments(parser, max_requests=640)
    parser.add_argument("--fit-iter", type=int, default=6, help="Gauss-Newton steps of each lower-half fit")
    parser.add_argument("--model", action="append", default=None,
                        help="only this model's rows (repeatable; default every model)")
    parser.add_argument("--vllm-version", default="",
                        help="only the rows of this vLLM generation (their source's vllm_version)")
    parser.add_argument("--split", type=int, default=32,
                        help="the lower half of a sweep: concurrency up to this (default 32)")
    args = parser.parse_args()
    rows = load_rows(args.data)
    for gpu in args.hardware or ["b200", "h200", "h100"]:
        hw_rows = [r for r in rows if r.deployment.hardware.name == gpu
                   and (args.model is None or r.deployment.model.name in args.model)
                   and (not args.vllm_version or r.tags.get("vllm_version") == args.vllm_version)]
        hw = catalog.load_hardware(gpu)
        if not hw_rows or hw.calibration is None:
            print(f"\n### {gpu}: no rows or no calibration")
            continue
        print(f"\n### {gpu} (fits: {', '.join('vLLM ' + v for v in generations.versions(hw))})\n")
        ev = Evaluator(hw_rows, args.max_requests, args.jobs)
        sims = shipped_sims(ev)
        held_out_summary(hw_rows, sims)
        print()
        extrapolation(ev, hw_rows, sims, args.split, args.fit_iter)
    return 0


if __name__ == "__main__":
    sys.exit(main())
