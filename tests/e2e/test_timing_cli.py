"""`--timing calibrated` through the real `sim` command: slower than the roofline on a
fitted preset, refused with a clear message on one without a fit, announced on one with a
transferred fit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from factories import fixed_workload

ROOT = Path(__file__).resolve().parents[2]


def sim(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    workload = fixed_workload(tmp_path / "w.toml", 8, 512, 32, users=4)
    return subprocess.run([sys.executable, "-P", "-m", "inference_lab", "--log-level", "WARNING", "sim",
                           "--config", str(ROOT / "configs" / "llama-3.1-8b.toml"), "--workload",
                           str(workload), "-o", str(tmp_path / "o.json"), *extra],
                          capture_output=True, text=True, timeout=60)


def test_calibrated_timing_is_slower_than_the_roofline_on_a_fitted_gpu(tmp_path):
    assert sim(tmp_path, "--hardware", "h100").returncode == 0
    roofline = json.loads((tmp_path / "o.json").read_text())["latency_metrics"]
    out = sim(tmp_path, "--hardware", "h100", "--timing", "calibrated")
    assert out.returncode == 0, out.stderr
    calibrated = json.loads((tmp_path / "o.json").read_text())["latency_metrics"]
    assert calibrated["per_token_ms"]["mean"] > 1.3 * roofline["per_token_ms"]["mean"]
    assert calibrated["ttft_ms"]["mean"] > roofline["ttft_ms"]["mean"]


def test_calibrated_timing_on_a_gpu_without_a_fit_is_refused(tmp_path):
    out = sim(tmp_path, "--hardware", "a100", "--timing", "calibrated")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "calibrated timing needs a [calibration] table in the a100 hardware preset" in out.stderr


def test_calibrated_timing_on_a_gpu_with_a_transferred_fit_says_so(tmp_path):
    out = sim(tmp_path, "--hardware", "b300", "--timing", "calibrated")
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("uses a calibration transferred from the b200 fit") == 1
    timing = json.loads((tmp_path / "o.json").read_text())["timing"]
    assert timing["model"] == "calibrated" and timing["calibration"] == "transferred from b200"


def test_a_vllm_generation_is_chosen_by_name_and_reported(tmp_path):
    out = sim(tmp_path, "--hardware", "h200", "--timing", "calibrated")
    assert out.returncode == 0, out.stderr
    own = json.loads((tmp_path / "o.json").read_text())
    out = sim(tmp_path, "--hardware", "h200", "--timing", "calibrated-v0.22")
    assert out.returncode == 0, out.stderr
    newer = json.loads((tmp_path / "o.json").read_text())
    assert own["timing"]["vllm_version"] == "0.11" and newer["timing"]["vllm_version"] == "0.22"
    assert newer["timing"]["model"] == "calibrated" and "vllm022" in newer["timing"]["fit"]
    assert newer["latency_metrics"]["per_token_ms"]["mean"] != own["latency_metrics"]["per_token_ms"]["mean"]


def test_a_vllm_generation_the_preset_lacks_is_refused_in_one_line(tmp_path):
    out = sim(tmp_path, "--hardware", "b200", "--timing", "calibrated-v0.22")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "the b200 hardware preset has no calibration for vLLM 0.22 (it has: calibrated-v0.11)" in out.stderr
    out = sim(tmp_path, "--hardware", "b200", "--timing", "calibrated-0.22")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "argument --timing: expected 'roofline', 'calibrated' or 'calibrated-v<vLLM version>'" in out.stderr
