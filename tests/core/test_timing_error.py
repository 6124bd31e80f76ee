"""The headline claims of docs/timing.md's error tables, on held-out rows of real vLLM
small enough to simulate in seconds: each fitted GPU's shipped calibration predicts their
TPOT within 10 % at the median and 20 % at worst, and the roofline default is faster
than real vLLM on every one of them by at least a fifth. The rows are never seen by the
fit (`holdout = true` in calibration/data); each is simulated with 4 x its clients'
requests instead of the source's 10 x (the full tables: benchmarks/timing_error.py)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from factories import calibration_fit

from inference_lab.calibrate.fitting import Evaluator, relative_errors
from inference_lab.engine.sim import catalog

ROOT = Path(__file__).resolve().parents[2]

# Per GPU: held-out rows of a model its calibration was fitted on, by label: InferenceMAX's
# gpt-oss-120b sweeps (vLLM 0.11) on B200 and H100, dstack's DeepSeek-R1 (vLLM 0.7) on H200.
SAMPLE = {
    "b200": ["gpt-oss-120b-b200-tp1-1k1k 1024/1024 c=16", "gpt-oss-120b-b200-tp2-1k1k 1024/1024 c=16",
             "gpt-oss-120b-b200-tp4-1k1k 1024/1024 c=16"],
    "h200": ["deepseek-r1-h200-tp8 3200/800 c=8", "deepseek-r1-h200-tp8 3200/800 c=32"],
    "h100": ["gpt-oss-120b-h100-tp2-8k1k-seqs16 8192/1024 c=16",
             "gpt-oss-120b-h100-tp4-8k1k-seqs16 8192/1024 c=16",
             "gpt-oss-120b-h100-tp8-8k1k-seqs16 8192/1024 c=16"],
}


def _rows():
    fit = calibration_fit()
    return {r.label: r for r in fit.load_rows(ROOT / "calibration" / "data")}


ROWS = _rows()


@pytest.mark.parametrize("gpu", sorted(SAMPLE))
def test_the_calibration_predicts_held_out_vllm_tpot_and_the_roofline_is_faster(gpu):
    rows = [ROWS[label] for label in SAMPLE[gpu]]
    assert all(r.holdout and r.deployment.hardware.name == gpu for r in rows)
    calibration = catalog.load_hardware(gpu).calibration
    assert calibration is not None and calibration.provenance == "fitted"
    roof, cal = Evaluator(rows, max_requests=1).sims([None, calibration])
    cal_err = [relative_errors(r, s)["tpot_ms"] for r, s in zip(rows, cal)]
    roof_err = [relative_errors(r, s)["tpot_ms"] for r, s in zip(rows, roof)]
    assert statistics.median(abs(e) for e in cal_err) <= 0.10, cal_err
    assert max(abs(e) for e in cal_err) <= 0.20, cal_err
    assert max(roof_err) <= -0.20, roof_err
