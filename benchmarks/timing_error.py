"""How far each timing model is from real vLLM: the error tables of docs/timing.md.

    python benchmarks/timing_error.py [--hardware b200 ...] [--data DIR]
                                      [--jobs 2] [--max-requests 1280] [--json FILE]

Simulates every row of `inference_lab/calibrate/data/*.toml` on its GPU under the roofline and
under the GPU preset's fit of the row's vLLM generation (its `[calibration]` unless
the preset has a `[calibration.generations]` table of the source's `vllm_version`), exactly as inference_lab.calibrate.fit_presets does
(closed-loop clients,
the source's own scheduler settings and lengths), and prints, per GPU, markdown tables of
the median and largest |simulated / measured - 1| per metric, with the roofline's beside:
fit rows, held-out rows (`holdout` in the data: never seen by the fit) and the rows of
sources the preset's fit does not name ("not fitted") apart, then per model. No fit here:
it measures the presets as they are shipped, so the tables stay true after a refit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from inference_lab.calibrate.fit_presets import DATA, load_rows
from inference_lab.calibrate.fitting import Evaluator, relative_errors
from inference_lab.calibrate.simulate import DEFAULT_MAX_REQUESTS, Point
from inference_lab.engine.sim import catalog, generations

METRIC_NAMES = {"tpot_ms": "TPOT", "tpot_p50_ms": "TPOT (median)", "ttft_ms": "TTFT",
                "ttft_p50_ms": "TTFT (median)", "e2e_ms": "end to end"}


def row_set(row: Point, fit: str) -> str:
    """"fit" or "held out" for a row of a source the preset's fit names (its `fit` string),
    "not fitted" for every row of a source it does not (data added after the fit, or kept
    out of it)."""
    if row.source not in fit:
        return "not fitted"
    return "held out" if row.holdout else "fit"


def calibration_of(row: Point):
    """The shipped fit that times `row`: the preset's fit of the row's vLLM generation
    (its source's `vllm_version`; engine.sim.generations), else the preset's own."""
    hw = row.deployment.hardware
    return generations.calibration_for(hw, row.tags.get("vllm_version", "")) or hw.calibration


def shipped_sims(ev: Evaluator) -> list[dict]:
    """The evaluator's rows, each simulated under its shipped fit (calibration_of)."""
    cals = [calibration_of(r) for r in ev.points]
    sims: dict[int, dict] = {}
    for cal in dict.fromkeys(cals):
        idx = [i for i, c in enumerate(cals) if c == cal]
        sims.update(zip(idx, ev.sims([cal], idx)[0]))
    return [sims[i] for i in range(len(cals))]


def errors(rows: list[Point], max_requests: int, jobs: int) -> list[dict]:
    """Per row: its set, model, and the relative error of each metric in both models."""
    ev = Evaluator(rows, max_requests, jobs)
    cal, roof = shipped_sims(ev), ev.sims([None])[0]
    out = []
    for row, r, c in zip(rows, roof, cal):
        out.append({"row": row.label, "source": row.source, "model": row.deployment.model.name,
                    "set": row_set(row, calibration_of(row).fit),
                    "calibrated": relative_errors(row, c), "roofline": relative_errors(row, r)})
    return out


def summarise(items: list[dict], key: str) -> dict[str, dict[str, dict[str, float]]]:
    """group (by `key`) -> metric -> {count, calibrated median/max, roofline median, signed
    roofline median} of |error|."""
    groups: dict[str, dict[str, dict[str, list[float]]]] = {}
    for it in items:
        for metric, err in it["calibrated"].items():
            g = groups.setdefault(it[key], {}).setdefault(metric, {"cal": [], "roof": []})
            g["cal"].append(err)
            g["roof"].append(it["roofline"][metric])
    out: dict[str, dict[str, dict[str, float]]] = {}
    for group, metrics in groups.items():
        for metric, v in metrics.items():
            out.setdefault(group, {})[metric] = {
                "count": len(v["cal"]),
                "calibrated_median": statistics.median(abs(x) for x in v["cal"]),
                "calibrated_max": max(abs(x) for x in v["cal"]),
                "roofline_median": statistics.median(abs(x) for x in v["roof"]),
                "roofline_signed_median": statistics.median(v["roof"]),
            }
    return out


def table(title: str, summary: dict, order: list[str]) -> str:
    lines = [f"| {title} | metric | rows | calibrated: median / max abs. error | "
             "roofline: median abs. error (signed) |", "|---|---|---|---|---|"]
    for group in order:
        for metric, s in sorted(summary.get(group, {}).items()):
            lines.append(f"| {group} | {METRIC_NAMES.get(metric, metric)} | {s['count']} | "
                         f"{s['calibrated_median']:.1%} / {s['calibrated_max']:.1%} | "
                         f"{s['roofline_median']:.1%} ({s['roofline_signed_median']:+.0%}) |")
    return "\n".join(lines)


SETS = ("fit", "held out", "not fitted")


def print_tables(items: list[dict]) -> dict:
    """Print one GPU's two tables (by row set; by model and row set); return the summaries."""
    by_set, by_model = summarise(items, "set"), summarise(items, "model")
    by_model_set = summarise([dict(it, ms=f"{it['model']}, {it['set']}") for it in items], "ms")
    models = sorted({it["model"] for it in items})
    print(table("rows", by_set, list(SETS)))
    print()
    print(table("model, rows", by_model_set, [f"{m}, {s}" for m in models for s in SETS]))
    return {"by_set": by_set, "by_model": by_model, "by_model_set": by_model_set, "rows": items}


def add_row_arguments(parser: argparse.ArgumentParser, max_requests: int = DEFAULT_MAX_REQUESTS) -> None:
    """--data, --hardware, --jobs, --max-requests: which rows, simulated how."""
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--hardware", action="append", default=None,
                        help="only this GPU preset (repeatable; default b200, h200, h100)")
    parser.add_argument("--jobs", type=int, default=1, help="simulations in parallel processes")
    parser.add_argument("--max-requests", type=int, default=max_requests,
                        help="simulate at most this many requests per row (at least 4 x its "
                             "concurrency)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_row_arguments(parser)
    parser.add_argument("--json", type=Path, help="also write the summaries here")
    args = parser.parse_args()
    gpus = args.hardware or ["b200", "h200", "h100"]
    rows = load_rows(args.data)
    report = {}
    for gpu in gpus:
        hw_rows = [r for r in rows if r.deployment.hardware.name == gpu]
        if not hw_rows:
            print(f"\n{gpu}: no rows")
            continue
        cal = catalog.load_hardware(gpu).calibration
        items = errors(hw_rows, args.max_requests, args.jobs)
        print(f"\n### {gpu} ({len(hw_rows)} rows; calibration: {cal.fit if cal else 'none'})\n")
        report[gpu] = print_tables(items)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
