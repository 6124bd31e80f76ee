"""The command line as a user of inference-lab's own CLI types it: `sim -c F -w W -q`
without --hardware on a one-entry config (that entry is taken), a dataset workload with
-t; and numeric flags out of range refused at parse time (exit 2, the flag named, no
traceback) instead of binding a wrapped port or crashing the engine child."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "inference_lab", "--log-level", "WARNING", *args],
                          capture_output=True, text=True, timeout=60, cwd=cwd, env=dict(os.environ))


@pytest.mark.parametrize(("args", "message"), [
    (("engine", "--port", "99999"), "argument --port: expected a port in 0..65535, got '99999'"),
    (("engine", "--metrics-port", "70000"), "argument --metrics-port: expected a port in 0..65535"),
    (("serve", "--engine-port", "-5"), "argument --engine-port: expected a port in 0..65535"),
    (("serve", "--metrics-port", "65536"), "argument --metrics-port: expected a port in 0..65535"),
    (("serve", "--grace", "-1"), "argument --grace: expected seconds in 0..86400, got '-1'"),
    (("engine", "--grace", "nan"), "argument --grace: expected seconds in 0..86400, got 'nan'"),
    (("gateway", "--engine", "nope"), "argument --engine: expected HOST:PORT with a port in 1..65535"),
    (("gateway", "--engine", "127.0.0.1:0"), "argument --engine: expected HOST:PORT"),
    (("engine", "--kv-cache-metrics-sample", "0"),
     "argument --kv-cache-metrics-sample: expected a rate in (0, 1], got '0'"),
    (("serve", "--backlog", "0"), "argument --backlog: must be from 1 to 65535, got 0"),
    (("gateway", "--backlog", "many"), "argument --backlog: must be a whole number of connections"),
    (("serve", "--saturated-status", "500"), "argument --saturated-status: invalid choice: 500"),
    (("gateway", "--saturated-retry-after", "-1"),
     "argument --saturated-retry-after: expected whole seconds in 0..86400, got '-1'"),
])
def test_an_out_of_range_flag_is_refused_before_anything_starts(args, message):
    out = cli(*args)
    assert out.returncode == 2, (out.returncode, out.stderr[-500:])
    assert message in out.stderr and "Traceback" not in out.stderr


def test_sim_takes_the_only_hardware_entry_and_the_short_flags_and_a_tokenizer_flag(tmp_path):
    config = tmp_path / "m.toml"
    config.write_text('model = "llama-3.1-8b"\n[scheduler]\nmax_num_seqs = 8\nmax_num_batched_tokens = 2048\n'
                      'block_size = 16\nenable_chunked_prefill = true\n[hardware.h100]\ntp = 1\n')
    (tmp_path / "d.jsonl").write_text(json.dumps(
        {"custom_id": "a", "body": {"messages": [{"role": "user", "content": "hello there"}],
                                    "max_tokens": 4}}) + "\n")
    workload = tmp_path / "w.toml"
    workload.write_text('dataset_path = "d.jsonl"\narrival_pattern = "poisson"\nseed = 1\n'
                        'input_len_dist = { type = "fixed", value = 1 }\n'
                        'output_len_dist = { type = "fixed", value = 50 }\n')
    out = cli("sim", "-c", str(config), "-w", str(workload), "-q", "-o", str(tmp_path / "o.json"),
              cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    summary = json.loads((tmp_path / "o.json").read_text())
    assert (summary["hardware"], summary["requests"]["completed"]) == ("h100", 1)
    bad = cli("sim", "-c", str(config), "-w", str(workload), "-t", str(tmp_path / "nope.json"), cwd=tmp_path)
    assert bad.returncode == 2 and "--tokenizer: tokenizer file" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_serve_passes_enable_mfu_metrics_to_its_engine_child_which_takes_it():
    from inference_lab.cli import build_parser
    from inference_lab.cli.cmd_serve import EngineProcess

    parser = build_parser()
    on = EngineProcess(parser.parse_args(["serve", "--enable-mfu-metrics"]), 0, "state")
    off = EngineProcess(parser.parse_args(["serve"]), 0, "state")
    assert "--enable-mfu-metrics" in on.argv and "--enable-mfu-metrics" not in off.argv
    engine_argv = on.argv[on.argv.index("engine"):]
    assert parser.parse_args(engine_argv).enable_mfu_metrics
