"""The router-signal flags on the real command line: a tokenizer file that does not parse
or a malformed --kv-events-config stops the start-up with a clear message (exit status 2),
never a traceback."""

from __future__ import annotations

import subprocess
import sys


def test_the_gateway_refuses_a_bad_tokenizer_at_start_up(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    run = subprocess.run([sys.executable, "-P", "-m", "inference_lab", "gateway", "--tokenizer",
                          str(bad)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "--tokenizer" in run.stderr and "not a Hugging Face tokenizer.json" in run.stderr
    assert "Traceback" not in run.stderr


def test_the_engine_refuses_a_malformed_kv_events_config_at_start_up():
    run = subprocess.run([sys.executable, "-P", "-m", "inference_lab", "engine",
                          "--kv-events-config", '{"enable_kv_cache_events": true, "endpont": "x"}'],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "--kv-events-config" in run.stderr and "unknown key 'endpont'" in run.stderr
    assert "Traceback" not in run.stderr


def test_the_engine_refuses_a_malformed_lora_module_at_start_up():
    run = subprocess.run([sys.executable, "-P", "-m", "inference_lab", "serve",
                          "--lora-modules", "sql-lora"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "--lora-modules" in run.stderr and "expected name=path" in run.stderr
    assert "Traceback" not in run.stderr
