"""Live capacity and live fault settings survive an engine killed mid-experiment (serve
restarts it) and a restart of the whole process tree with the same --state-dir."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from inference_lab.testing.launch import serve
from inference_lab.testing.poll import wait_until

MODEL = "gpt-oss-20b"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def call(base: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def capacity(base: str) -> tuple[int, int]:
    _, rows = call(base, "/control/capacity")
    return rows[0]["max_num_seqs"], rows[0]["max_waiting"]


def healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(base + "/health", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


@pytest.mark.tools("curl")
def test_sigkill_of_the_engine_mid_experiment_keeps_live_capacity_and_faults():
    with serve() as lab:  # no --state-dir: serve keeps a directory for its own lifetime
        assert call(lab.base, "/control/capacity", {"max_num_seqs": 8, "max_waiting": 5})[0] == 200
        # mid-experiment: a long stream in flight when the engine dies
        stream = subprocess.Popen(
            ["curl", "-sN", "-m", "20", f"{lab.base}/v1/chat/completions", "-d",
             json.dumps({**CHAT, "stream": True, "max_tokens": 50_000})],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        wait_until(lambda: call(lab.base, "/control/capacity")[1][0]["running"] == 1, timeout=30)
        call(lab.base, "/control/faults",
             {"retry_after_ms": 250, "script": [{"error": "rate_limit", "count": 2}]})
        assert call(lab.base, "/v1/chat/completions", CHAT)[0] == 429  # one step used
        (engine,) = lab.engine_pids()
        os.kill(engine, signal.SIGKILL)
        out, _ = stream.communicate(timeout=30)
        assert b"engine_unavailable" in out  # the stream ended with an error frame
        wait_until(lambda: len(lab.engine_pids()) == 2 and healthy(lab.base), timeout=30)
        assert capacity(lab.base) == (8, 5)
        assert "restored live capacity of gpt-oss-20b" in lab.log()
        _, faults = call(lab.base, "/control/faults")  # the gateway's own, untouched
        assert faults["scripts"]["*"] == [{"error": "rate_limit", "count": 1}]


def test_a_restart_of_everything_with_the_same_state_dir_restores_both(tmp_path):
    state = str(tmp_path / "state")
    with serve("--state-dir", state) as lab:
        call(lab.base, "/control/capacity", {"max_num_seqs": 8, "max_waiting": 5})
        call(lab.base, "/control/faults", {"model": MODEL, "rate": 0.25, "seed": 9,
                                           "retry_after": 3})
        # a container killed outright: no chance to save anything on the way out
        for pid in (*lab.engine_pids(), lab.proc.pid):
            os.kill(pid, signal.SIGKILL)
        lab.proc.wait(timeout=10)
    assert sorted(os.listdir(state)) == ["capacity.json", "faults.json"]
    with serve("--state-dir", state) as lab:
        assert capacity(lab.base) == (8, 5)
        _, faults = call(lab.base, "/control/faults")
        assert faults["seed"] == 9
        assert faults["models"][MODEL]["rate"] == 0.25
        assert faults["models"][MODEL]["retry_after"] == 3
        log = lab.log()
        assert "restored live capacity of gpt-oss-20b" in log
        assert "restored live fault settings" in log


def test_a_corrupt_state_file_stops_serve_with_one_line(tmp_path):
    (tmp_path / "faults.json").write_text("{not json")
    proc = subprocess.run([sys.executable, "-P", "-m", "inference_lab", "serve", "--state-dir",
                           str(tmp_path), "--port", "0"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert "faults.json" in proc.stderr and "Traceback" not in proc.stderr


def test_a_crash_fault_exits_the_engine_and_serve_restarts_it():
    with serve() as lab:
        call(lab.base, "/control/capacity", {"max_num_seqs": 4})
        status, state = call(lab.base, "/control/faults/replica", {"fault": "crash"})
        assert status == 200 and state["replica"] is None  # the whole engine
        wait_until(lambda: len(lab.engine_pids()) == 2 and healthy(lab.base), timeout=30)
        assert "engine exited with status 70" in lab.log()
        assert capacity(lab.base)[0] == 4
