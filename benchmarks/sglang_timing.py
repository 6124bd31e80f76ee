"""The sglang profile's calibrated timing against public SGLang rows: per-row error and the
median |error| of TPOT and TTFT on the fit rows and on the held-out ones.

Simulates every row of inference_lab/calibrate/data/inferencex-deepseek-r1-sglang-h200.toml
(DeepSeek-R1-0528 FP8, 8 x H200, 1k/1k, SGLang) with the sglang profile and its fitted
[sglang.h200] table (engine/sim/profiles/calibration.toml). No pass/fail: a benchmark.

    nice python benchmarks/sglang_timing.py [--max-requests N]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
import shutil

from inference_lab.calibrate.fit_presets import DATA, load_rows
from inference_lab.calibrate.fitting import Evaluator, relative_errors
from inference_lab.engine.sim.profiles import calibration

FILE = "inferencex-deepseek-r1-sglang-h200.toml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-requests", type=int, default=1280)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(DATA / FILE, Path(tmp) / FILE)
        rows = load_rows(Path(tmp))
    cal = calibration("sglang", "h200")
    sims = Evaluator(rows, args.max_requests, 1).sims([cal])[0]
    errors: dict[tuple[str, str], list[float]] = {}
    for row, sim in zip(rows, sims):
        part = "held-out" if row.holdout else "fit"
        for key, err in relative_errors(row, sim).items():
            errors.setdefault((part, key), []).append(abs(err))
            print(f"{row.label:46s} {key:12s} measured {row.measured[key]:8.2f} "
                  f"simulated {sim[key]:8.2f} {err:+7.1%} {part}")
    for (part, key), errs in sorted(errors.items()):
        print(f"{part:9s} {key:12s} median |error| {statistics.median(errs):5.1%}  "
              f"max {max(errs):5.1%}  ({len(errs)} rows)")


if __name__ == "__main__":
    main()
