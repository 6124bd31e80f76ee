"""The headline claims of docs/timing.md's error tables, on held-out rows of real vLLM
small enough to simulate in seconds: each fitted GPU's shipped calibration predicts their
TPOT within 10 % at the median and 20 % at worst, and the roofline default is faster
than real vLLM on every one of them by at least a fifth. The rows are never seen by the
fit (`holdout = true` in inference_lab/calibrate/data); each is simulated with 4 x its clients'
requests instead of the source's 10 x (the full tables: benchmarks/timing_error.py)."""

from __future__ import annotations

import statistics

import pytest

from inference_lab.calibrate import fit_presets
from inference_lab.calibrate.fitting import Evaluator, relative_errors
from inference_lab.engine.sim import catalog, generations

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


ROWS = {r.label: r for r in fit_presets.load_rows()}


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


# B200's held-out rows furthest from real vLLM before the routers' skew and the partial
# overlap of math and memory were modelled: gpt-oss's long-output sweep at TP 1 and 64 and
# 128 clients (+24 % and +18 %) and at TP 4 and 64 clients (+22 %: with its per-sequence
# cost fitted on steps that prefill beside their decodes); and, before the per-sequence GPU
# work split over the TP group and MiniMax's NVFP4 scales and QK-norm all-reduce were
# modelled, MiniMax NVFP4 at TP 2 and 256 clients (+27 %: the simulated KV cache held more
# sequences than vLLM's) and at TP 4 and 8 clients (-21 %).
WORST_B200 = ["gpt-oss-120b-b200-tp1-1k8k 1024/8192 c=64", "gpt-oss-120b-b200-tp1-1k8k 1024/8192 c=128",
              "gpt-oss-120b-b200-tp4-1k1k 1024/1024 c=64", "gpt-oss-120b-b200-tp4-1k8k 1024/8192 c=64",
              "minimax-m2.5-nvfp4-b200-tp2 8192/1024 c=256", "minimax-m2.5-nvfp4-b200-tp4 8192/1024 c=8"]


def test_the_b200_rows_furthest_off_are_within_a_fifth():
    rows = [ROWS[label] for label in WORST_B200]
    assert all(r.holdout and r.deployment.hardware.name == "b200" for r in rows)
    (cal,) = Evaluator(rows, max_requests=1).sims([catalog.load_hardware("b200").calibration])
    errors = {r.label: round(relative_errors(r, s)["tpot_ms"], 3) for r, s in zip(rows, cal)}
    assert max(abs(e) for e in errors.values()) <= 0.20, errors


# The H200's vLLM 0.22 generation (engine.sim.generations) on its held-out rows: the
# 8000 / 1000 sweep at 2 and 16 clients and InferenceX's recipe at 4 clients, both shapes.
SAMPLE_H200_022 = ["gpt-oss-120b-h200-vllm022 8000/1000 c=2", "gpt-oss-120b-h200-vllm022 8000/1000 c=16",
                   "gpt-oss-120b-h200-vllm022-1k1k-c4 1024/1024 c=4",
                   "gpt-oss-120b-h200-vllm022-8k1k-c4 8192/1024 c=4"]


def test_the_h200_vllm_022_generation_predicts_its_held_out_tpot():
    rows = [ROWS[label] for label in SAMPLE_H200_022]
    assert all(r.holdout and r.tags["vllm_version"] == "0.22" for r in rows)
    fit = generations.calibration_for(catalog.load_hardware("h200"), "0.22")
    (cal,) = Evaluator(rows, max_requests=1).sims([fit])
    errors = [relative_errors(r, s)["tpot_ms"] for r, s in zip(rows, cal)]
    assert statistics.median(abs(e) for e in errors) <= 0.10, errors
    assert max(abs(e) for e in errors) <= 0.20, errors


# The growth with the batch, on B200's gpt-oss-120b sweeps at TP 1 with short prompts and
# long outputs. A fit whose routing skew leaves the sweeps' curvature to a linear
# per-sequence cost grows too steeply past their middle (at skew 1.05: +16 % and +19 % at
# 128 clients, against -6 % and -5 % at 16), and a fit of `calibrate`'s default parameters
# on the rows up to 32 clients then overshoots the top by 18-19 %. Held to 10 % at the top
# and 15 % for the lower half's prediction (docs/timing.md, "Timing past the rows").
SWEEPS_B200 = ["gpt-oss-120b-b200-tp1-1k1k 1024/1024", "gpt-oss-120b-b200-tp1-1k8k 1024/8192"]


@pytest.mark.parametrize("sweep", SWEEPS_B200)
def test_the_b200_fit_grows_with_the_batch_as_vllm_does_and_its_lower_half_predicts_the_top(sweep):
    from inference_lab.calibrate.fitting import fit
    from inference_lab.cli.cmd_calibrate import DEFAULT_FIT

    rows = sorted((r for label, r in ROWS.items() if label.startswith(sweep + " c=")),
                  key=lambda r: r.concurrency)
    assert [r.concurrency for r in rows] == [4, 8, 16, 32, 64, 128]
    shipped = catalog.load_hardware("b200").calibration
    ev = Evaluator(rows, max_requests=1)
    (sims,) = ev.sims([shipped])
    errors = [relative_errors(r, s)["tpot_ms"] for r, s in zip(rows, sims)]
    assert abs(errors[-1]) <= 0.10, errors
    low = [i for i, r in enumerate(rows) if r.concurrency <= 32]
    result = fit(ev, shipped, DEFAULT_FIT, low, 4)
    (top,) = ev.sims([result.calibration], [len(rows) - 1])
    assert abs(relative_errors(rows[-1], top[0])["tpot_ms"]) <= 0.15
