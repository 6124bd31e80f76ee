"""Starting the real `inference-lab serve` command on free loopback ports."""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import json
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_run(count: int) -> int:
    """A port p such that p .. p + count - 1 are all free now (replica i on p + i), below
    the kernel's ephemeral range, so that client connections do not take them later."""
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    for _ in range(200):
        base = random.randrange(max(low - 12000, 1024), low - count)
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"no run of {count} free ports found")


class Served:
    def __init__(self, proc: subprocess.Popen, port: int, engine_port: int, log_path: str):
        self.proc = proc
        self.port = port
        self.engine_port = engine_port
        self.log_path = log_path
        self.base = f"http://127.0.0.1:{port}"

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def engine_pids(self) -> list[int]:
        return [int(p) for p in re.findall(r"engine started: pid (\d+)", self.log())]

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        raise AssertionError(f"serve did not become healthy:\n{self.log()}")


@contextlib.contextmanager
def serve(*extra: str, grace: float = 2.0, ports: int = 1):
    """`python -m inference_lab serve` on free ports (`ports` consecutive ones for the
    gateway: replica i on port + i); stopped with SIGTERM afterwards."""
    port, engine_port = free_port_run(ports), free_port()
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "inference_lab", "serve", "--port", str(port),
         "--engine-port", str(engine_port), "--metrics-port", "0", "--grace", str(grace), *extra],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    served = Served(proc, port, engine_port, log.name)
    try:
        served.wait_healthy()
        yield served
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace + 20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in served.engine_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.unlink(log.name)


def json_request(base: str, method: str, path: str, body=None) -> tuple[int, dict | list]:
    """One JSON request with urllib: (status, parsed body), error statuses included."""
    req = urllib.request.Request(base + path, method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
