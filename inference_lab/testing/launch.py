"""The real commands (`serve`, `engine`, `gateway`) as processes on free loopback ports,
for tests and benchmarks alike (one launcher: tests/ and benchmarks/ import this).

Knows: how each command is started (`python -P -m inference_lab ...`: with the current
directory off sys.path the installed package runs, from any folder), that its output goes
to a log file, when it is ready (`serve`: GET /health answers 200; `engine`: it printed
`engine ready`; `gateway`: it logged `gateway listening`), and how it is stopped (SIGTERM,
then SIGKILL; the engine child `serve` logged is killed if it outlives it). Does not know
what a test or a benchmark does with the process.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

from inference_lab.common.ports import free_port, free_port_run

ENGINE_STARTED = re.compile(r"engine started: pid (\d+), engine ready: grpc \S+ metrics (\d+)")


def command(*args: str) -> list[str]:
    """argv of `inference-lab ARGS` run by this interpreter."""
    return [sys.executable, "-P", "-m", "inference_lab", *args]


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> int | None:
    """SIGTERM, then SIGKILL after `timeout`; the exit status when SIGTERM sufficed (or
    the process had already exited), else None."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return None
    return proc.returncode


def wait_http_ok(url: str, proc: subprocess.Popen, timeout: float = 60.0,
                 log: Callable[[], str] | None = None) -> None:
    """Until `url` answers 200; AssertionError (with `log()`) if `proc` exits first or
    the time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[3:5]} exited with {proc.returncode}:\n"
                                 f"{log() if log else ''}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer within {timeout} s:\n{log() if log else ''}")


class Proc:
    """A command whose output goes to a log file. `close()` kills and reaps it, kills the
    engine children it logged (`serve` starts its engine in a session of its own) and
    removes the log."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self._log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.argv = argv
        self.log_path = self._log.name
        self.port = 0
        self.metrics_port = 0
        self.proc = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        with open(self._log.name) as f:
            return f.read()

    def engine_pids(self) -> list[int]:
        """Every engine child `serve` logged as started (restarts included)."""
        return [int(p) for p in re.findall(r"engine started: pid (\d+)", self.log())]

    def api_server_pids(self) -> list[int]:
        """Every API server child `serve --api-server-count A` logged as started."""
        return [int(p) for p in re.findall(r"API server \d+ started: pid (\d+)", self.log())]

    def wait_for_log(self, pattern: str, timeout: float = 30.0) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(pattern, self.log())
            if match:
                return match
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.argv[3:5]} exited {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} in the log within {timeout} s:\n{self.log()}")

    def wait_http_ok(self, url: str, timeout: float = 60.0) -> None:
        """Until `url` answers 200 (AssertionError with the log if the process exits)."""
        wait_http_ok(url, self.proc, timeout, self.log)

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait; SIGKILL if it does not exit in time. The exit status."""
        status = stop_process(self.proc, timeout)
        if status is None:
            raise AssertionError(f"did not exit within {timeout} s of SIGTERM:\n{self.log()}")
        return status

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        self.kill()
        for pid in self.engine_pids() + self.api_server_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.unlink(self._log.name)


class Served(Proc):
    """A running `inference-lab serve` (the gateway is the serve process itself)."""

    def __init__(self, argv: list[str], port: int, engine_port: int,
                 env: dict[str, str] | None = None) -> None:
        super().__init__(argv, env)
        self.port = port
        self.engine_port = engine_port
        self.base = f"http://127.0.0.1:{port}"
        self.engine_pid = 0
        self.exit_status: int | None = None  # of serve, once stopped

    @property
    def gateway_pid(self) -> int:
        return self.proc.pid

    def wait_healthy(self, timeout: float = 60.0) -> None:
        self.wait_http_ok(self.base + "/health", timeout)
        # every process up (several API servers share the port: the first answers before
        # the last is listening): serve says so once they all are
        self.wait_for_log(r"serving on http://\S+ \(Ctrl-C to stop\)", timeout)
        match = ENGINE_STARTED.findall(self.wait_for_log(ENGINE_STARTED.pattern, 10.0).string)
        self.engine_pid, self.metrics_port = int(match[-1][0]), int(match[-1][1])

    def engine_metrics(self) -> str:
        """The engines' series: the engine's own /metrics, or with several engine
        processes the API port's, which merges every one's (data-parallel ranks)."""
        many = len(set(self.engine_pids())) > 1
        url = self.base + "/metrics" if many else f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read().decode()

    def capacity(self, update: dict | None = None) -> list:
        url = self.base + "/control/capacity"
        if update is None:
            req = urllib.request.Request(url)
        else:
            req = urllib.request.Request(url, data=json.dumps(update).encode(), method="POST",
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())


@contextlib.contextmanager
def serve(*extra: str, grace: float = 2.0, env: dict[str, str] | None = None,
          port: int | None = None, ports: int = 1) -> Iterator[Served]:
    """`inference-lab serve` on free loopback ports (engine metrics on a free port too),
    or on `port` when given; `ports` consecutive free ones with --replicas (replica i on
    port + i). Healthy when yielded; SIGTERM afterwards (`exit_status` holds how it
    ended), and the engine child is killed if it outlives it."""
    if port is None:  # the gateway's run and the engine's port, side by side (never equal)
        port = free_port_run(ports + 1)
        engine_port = port + ports
    else:
        engine_port = free_port()
    served = Served(command("serve", "--host", "127.0.0.1", "--port", str(port),
                            "--engine-port", str(engine_port), "--metrics-port", "0",
                            "--grace", str(grace), *extra), port, engine_port, env)
    try:
        served.wait_healthy()
        yield served
    finally:
        served.exit_status = stop_process(served.proc, timeout=grace + 20)
        served.close()


@contextlib.contextmanager
def engine_process(*extra: str, port: int | None = None, env: dict[str, str] | None = None,
                   log_level: str | None = None) -> Iterator[Proc]:
    """`inference-lab engine` on 127.0.0.1 (a free port unless given, metrics on a free
    one); `.port` is its gRPC port and `.metrics_port` its /metrics port once it printed
    `engine ready`. `log_level` (e.g. WARNING) keeps a benchmark's engine quiet."""
    port = port or free_port()
    level = ("--log-level", log_level) if log_level else ()
    proc = Proc(command(*level, "engine", "--host", "127.0.0.1", "--port", str(port),
                        "--metrics-port", "0", *extra), env)
    try:
        ready = proc.wait_for_log(r"engine ready: grpc 127\.0\.0\.1:\d+ metrics (\d+)")
        proc.port, proc.metrics_port = port, int(ready.group(1))
        yield proc
    finally:
        proc.close()


@contextlib.contextmanager
def gateway_process(engine_port: int, *extra: str, port: int | None = None,
                    env: dict[str, str] | None = None) -> Iterator[Proc]:
    """`inference-lab gateway` on a free 127.0.0.1 port in front of the engine; `.port`."""
    port = port or free_port()
    proc = Proc(command("gateway", "--engine", f"127.0.0.1:{engine_port}", "--host",
                        "127.0.0.1", "--port", str(port), *extra), env)
    try:
        proc.wait_for_log(r"gateway listening on http://")
        proc.port = port
        yield proc
    finally:
        proc.close()
