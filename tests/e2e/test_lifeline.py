"""No process of the lab outlives the one that started it, and nothing is left behind:
`serve` killed outright takes its engine with it (within 5 s, its ports free, its temporary
state directory gone); `experiment --serve` stopped by SIGTERM, SIGINT or SIGKILL, while
its server runs or while it starts, takes its `serve` and engine with it; the engine's
ipc:// KV-event socket files are gone after an orderly stop and after a kill of `serve`.

Each run gets a TMPDIR of its own: the processes of the run are those whose environment
names it (reparented orphans included), and its temporary state directory is made in it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from inference_lab.common.lifeline import PARENT_PID_ENV
from inference_lab.testing.launch import Proc, command, serve
from inference_lab.testing.poll import wait_until
from scenario_text import closed_loop

GONE_WITHIN_S = 5.0  # the promise: a child ends within 5 s of its parent, ports released

SCENARIO = closed_loop("long", 600, 2, limit=2, window=1.0, server="max_num_seqs = 8")


def lab_processes(tmpdir: Path) -> list[int]:
    """Live processes (zombies aside) whose environment has TMPDIR=`tmpdir`."""
    marker = f"TMPDIR={tmpdir}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:  # gone meanwhile, or not ours to read
            continue
        found.append(int(entry))
    return found


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode().split("\0")
    except OSError:  # gone meanwhile
        return []


def engine_port(tmpdir: Path) -> int:
    """The gRPC port of the run's engine, from its argv."""
    for pid in lab_processes(tmpdir):
        argv = cmdline(pid)
        if "engine" in argv:
            return int(argv[argv.index("--port") + 1])
    raise AssertionError("no engine among the run's processes")


def port_free(port: int) -> bool:
    """A listener can bind it again (as a restarted server would, with SO_REUSEADDR)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError:
            return False
    return True


def assert_nothing_left(tmpdir: Path, ports: list[int]) -> None:
    wait_until(lambda: not lab_processes(tmpdir), timeout=GONE_WITHIN_S,
               what=f"no process of the run left (left: {lab_processes(tmpdir)})")
    assert [p for p in ports if not port_free(p)] == []
    assert sorted(p.name for p in tmpdir.glob("inference-lab-state-*")) == []


def kv_events(endpoint: str) -> tuple[str, str]:
    return "--kv-events-config", json.dumps({"enable_kv_cache_events": True,
                                             "endpoint": endpoint})


@pytest.fixture
def tmpdir_env(tmp_path: Path):
    where = tmp_path / "tmp"
    where.mkdir()
    yield where, {"TMPDIR": str(where)}
    for pid in lab_processes(where):  # what a failing run left behind: not for the next test
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_serve_killed_outright_takes_its_engine_ports_state_dir_and_sockets_along(tmpdir_env, tmp_path):
    tmpdir, env = tmpdir_env
    sockets = tmp_path / "kv-events"
    with serve(*kv_events(f"ipc://{sockets}"), env=env) as served:
        assert served.engine_pid in lab_processes(tmpdir)
        assert sockets.exists() and list(tmpdir.glob("inference-lab-state-*"))
        served.proc.kill()
        served.proc.wait()
        assert_nothing_left(tmpdir, [served.port, served.engine_port, served.metrics_port])
        assert not sockets.exists()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_serve_of_two_ranks_and_two_api_servers_leaves_nothing_whatever_ends_it(
        tmpdir_env, tmp_path, sig):
    # vLLM's shape: an engine process per rank, two gateways sharing the port; SIGKILL of
    # `serve` (their lifelines end them) or SIGTERM (its orderly stop): within 5 s no
    # process of the run is left, every port is free, and no state directory or socket
    tmpdir, env = tmpdir_env
    sockets = tmp_path / "kv-events"
    with serve(*kv_events(f"ipc://{sockets}"), "--data-parallel-size", "2",
               "--api-server-count", "2", env=env) as served:
        children = set(served.engine_pids()) | set(served.api_server_pids())
        assert len(children) == 4 and children <= set(lab_processes(tmpdir))
        ports = [served.port] + [int(cmdline(p)[cmdline(p).index("--port") + 1])
                                 for p in served.engine_pids()]
        assert sockets.exists() and Path(f"{sockets}_dp1").exists()
        served.proc.send_signal(sig)
        served.proc.wait(timeout=30)
        assert_nothing_left(tmpdir, ports)
        assert not sockets.exists() and not Path(f"{sockets}_dp1").exists()


def test_serve_stopped_in_order_removes_the_ipc_socket_files(tmpdir_env, tmp_path):
    tmpdir, env = tmpdir_env
    sockets = tmp_path / "kv-events"
    with serve(*kv_events(f"ipc://{sockets}"), "--replicas", "2", ports=2, env=env) as served:
        assert sockets.exists() and Path(f"{sockets}_dp1").exists()
    assert served.exit_status == 0
    assert not sockets.exists() and not Path(f"{sockets}_dp1").exists()
    assert_nothing_left(tmpdir, [served.port, served.port + 1, served.engine_port])


@pytest.mark.parametrize("sig, when, status", [
    (signal.SIGTERM, "running", 128 + signal.SIGTERM),
    (signal.SIGTERM, "starting", 128 + signal.SIGTERM),
    (signal.SIGINT, "starting", 128 + signal.SIGINT),
    (signal.SIGKILL, "running", -signal.SIGKILL),
])
def test_experiment_serve_stopped_by_a_signal_leaves_no_process_port_or_state_dir(
        tmpdir_env, tmp_path, sig, when, status):
    tmpdir, env = tmpdir_env
    scenario = tmp_path / "long.toml"
    scenario.write_text(SCENARIO)
    run = Proc(command("experiment", str(scenario), "--serve", "--out", str(tmp_path / "run")),
               env=env)
    try:
        ports: list[int] = []
        if when == "running":
            url = run.wait_for_log(r"running long .* against http://127\.0\.0\.1:(\d+)", 90)
            ports = [int(url.group(1)), engine_port(tmpdir)]
        else:  # its `serve` child runs (past exec), not yet serving
            def serve_started() -> bool:
                return any("serve" in cmdline(pid) for pid in lab_processes(tmpdir)
                           if pid != run.pid)
            wait_until(serve_started, timeout=30, interval=0.01, what="serve started")
            assert not re.search("running long", run.log())
        run.proc.send_signal(sig)
        exited = run.proc.wait(timeout=30)
        assert_nothing_left(tmpdir, ports)
        assert exited == status, run.log()
    finally:
        run.close()


def test_a_child_whose_recorded_parent_is_already_gone_exits_at_once(tmp_path):
    # The parent recorded is not this child's parent: as when it died before the child
    # asked for the death signal.
    done = subprocess.run(command("engine", "--port", "0", "--metrics-port", "0"),
                          env={**os.environ, PARENT_PID_ENV: str(os.getppid())},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert f"the parent process {os.getppid()} is gone; exiting" in done.stderr
