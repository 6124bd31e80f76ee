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


def test_clashing_ports_are_refused_before_anything_is_bound():
    """The KV replay port on replica 1's HTTP port: said at once, with both names, and the
    engine is never started (nothing listens on the engine port asked for)."""
    from inference_lab.common.ports import free_port, free_port_run

    http, engine = free_port_run(3), free_port()
    config = ('{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:%d", '
              '"replay_endpoint": "tcp://127.0.0.1:%d"}' % (free_port(), http + 1))
    run = subprocess.run([sys.executable, "-P", "-m", "inference_lab", "serve", "--port", str(http),
                          "--engine-port", str(engine), "--replicas", "3",
                          "--kv-events-config", config], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert (f"port {http + 1} is both replica 1's HTTP port and replica 0's KV replay port"
            in run.stderr), run.stderr
    assert "engine started" not in run.stdout and "Traceback" not in run.stderr
