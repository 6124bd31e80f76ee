"""The core install serves without its extras, and a feature whose extra is missing says
which extra in one line (exit status 2, no traceback).

The extras' packages are blocked for the command and its children: a directory first on
PYTHONPATH holds a `zmq`, `pyarrow`, `matplotlib` and `tokenizers` module that raise
ImportError, as an install without `[kv-events]`, `[experiments]` and `[tokenizer]` would.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

import pytest

from inference_lab.common.extras import EXTRAS
from inference_lab.testing.launch import command, serve


@pytest.fixture(scope="module")
def without_extras(tmp_path_factory) -> dict[str, str]:
    """The environment of a process that cannot import any extra's package."""
    blocked = tmp_path_factory.mktemp("without-extras")
    for modules in EXTRAS.values():
        for module in modules:
            (blocked / f"{module}.py").write_text(
                f"raise ImportError('{module} is blocked: an install without the extras')\n")
    path = os.pathsep.join(filter(None, [str(blocked), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path}


def test_serve_answers_health_and_a_completion_without_the_extras(without_extras):
    with serve(env=without_extras) as served:
        with urllib.request.urlopen(f"http://127.0.0.1:{served.port}/health", timeout=10) as r:
            assert r.status == 200
        body = json.dumps({"model": "gpt-oss-20b", "prompt": "once upon a time",
                           "max_tokens": 5}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{served.port}/v1/completions",
                                         data=body, headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as r:
            reply = json.loads(r.read())
        assert r.status == 200
        assert reply["usage"]["completion_tokens"] == 5
        assert "Traceback" not in served.log()


CONFIGS = Path(__file__).resolve().parents[2] / "configs"
KV_EVENTS = json.dumps({"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:0"})


@pytest.mark.parametrize("args, line", [
    (("serve", "--kv-events-config", KV_EVENTS),
     "inference-lab: error: KV events need pyzmq: pip install 'inference-lab[kv-events]'"),
    (("engine", "--kv-events-config", KV_EVENTS),
     "inference-lab: error: KV events need pyzmq: pip install 'inference-lab[kv-events]'"),
    (("serve", "--tokenizer", "tokenizer.json"),
     "inference-lab: error: --tokenizer needs tokenizers: pip install 'inference-lab[tokenizer]'"),
    (("sim", "-c", str(CONFIGS / "gpt-oss-20b.toml"), "-w",
      str(CONFIGS / "workloads" / "chat-closed-loop-256.toml"), "--tokenizer", "tokenizer.json"),
     "inference-lab sim: error: --tokenizer needs tokenizers: "
     "pip install 'inference-lab[tokenizer]'"),
    (("experiment", "compare", "run-a", "run-b"),
     "inference-lab experiment: error: experiments need matplotlib: "
     "pip install 'inference-lab[experiments]'"),
], ids=["serve-kv-events", "engine-kv-events", "serve-tokenizer", "sim-tokenizer", "experiment"])
def test_a_feature_without_its_extra_names_the_extra_in_one_line(without_extras, args, line):
    done = subprocess.run(command(*args), env={**os.environ, **without_extras}, text=True,
                          capture_output=True, timeout=60)
    assert (done.returncode, done.stderr.splitlines(), done.stdout) == (2, [line], "")


def test_kv_events_turned_off_need_no_extra(without_extras):
    """A config that leaves the events off (vLLM's default) parses without pyzmq."""
    off = json.dumps({"enable_kv_cache_events": False})
    done = subprocess.run(command("engine", "--kv-events-config", off, "--help"),
                          env={**os.environ, **without_extras}, text=True,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
