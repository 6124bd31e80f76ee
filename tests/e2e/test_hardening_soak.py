"""Soak, short: benchmarks/soak.py for ~9 s against the real `serve` at saturation, with
streaming clients of which a fifth hang up mid-stream. After a warm-up neither process
grows by 10 % or more, nothing is left waiting or running, and every completed stream
carried exactly its token count."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


def load_soak():
    if str(SOAK.parent) not in sys.path:
        sys.path.insert(0, str(SOAK.parent))  # soak.py imports benchmarks/_common.py
    spec = importlib.util.spec_from_file_location("benchmarks_soak", SOAK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_short_soak_at_saturation_leaks_nothing_and_counts_every_token(capsys):
    soak = load_soak()
    result = soak.run_soak(soak.Config(duration=9.0, warmup=3.0, clients=48))
    with capsys.disabled():
        print("\n" + soak.report(result))
    counts = result["counts"]
    load = result["during_load"]
    assert (load["max_running"], load["max_waiting"]) == (16, 16)  # saturated: batch and queue
    assert load["mean_running"] > 8 and counts["refused_529"] > 0
    assert counts["completed"] >= 100 and counts["disconnected"] >= 10
    assert counts["mismatched"] == 0 and counts["exact"] == counts["completed"]
    assert counts["errors"] == 0
    assert result["after"] == {"waiting": 0, "running": 0}
    for name, growth in result["rss_growth_after_warmup_pct"].items():
        assert growth < 10.0, (name, result["rss_mib"])
    assert result["serve_exit_status"] == 0
