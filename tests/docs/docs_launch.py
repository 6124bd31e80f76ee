"""`inference-lab serve | engine | gateway` as a documentation example types it: started in
the background on the ports the docs test gave the page, returning once it is ready.

The docs test runs every shell example with `inference-lab` as a shell function that hands
these three commands to this script (every other subcommand runs as typed). An example
says `inference-lab serve` and then talks to it, as a reader would in two terminals; here
the server goes to the background, its port flags default to the page's ports (the ones
the test wrote into the example in place of 8080, 50051 and 50052), and a later start on
any of the same ports first stops the earlier process (a reader restarting the server).

Knows: each command's port flags and readiness (`serve`: GET /health answers 200 and its
engine is up; `engine`: it printed `engine ready`; `gateway`: it logged `gateway
listening`), and how to stop what it started (`stop_all`, called by the test when the page
is done). Does not know what the examples do with the servers.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from inference_lab.testing.poll import wait_until

READY = {
    "engine": re.compile(r"engine ready: grpc"),
    "gateway": re.compile(r"gateway listening on http://"),
    "serve": re.compile(r"engine started: pid \d+, engine ready"),
}
ENGINE_CHILD = re.compile(r"engine started: pid (\d+)")
REGISTRY = "servers.jsonl"


def flag(args: list[str], name: str) -> str | None:
    """The value of `--name V` or `--name=V` in args (the last one), else None."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def with_defaults(command: str, args: list[str], ports: dict[str, int]) -> list[str]:
    """The example's arguments plus the page's ports for the port flags it left out, and
    a short grace so that a stop at the end of the page is quick."""
    defaults = {
        "serve": {"--port": ports["http"], "--engine-port": ports["engine"],
                  "--metrics-port": ports["metrics"], "--grace": 2},
        "engine": {"--port": ports["engine"], "--metrics-port": ports["metrics"], "--grace": 2},
        "gateway": {"--port": ports["http"], "--engine": f"127.0.0.1:{ports['engine']}"},
    }[command]
    return [*args, *(x for name, value in defaults.items() if flag(args, name) is None
                     for x in (name, str(value)))]


def ports_of(command: str, args: list[str]) -> set[int]:
    """Every port the command will listen on (a serve of N replicas: port .. port + N - 1)."""
    port = int(flag(args, "--port"))
    if command == "gateway":
        return {port}
    replicas = int(flag(args, "--replicas") or 1)
    metrics = int(flag(args, "--metrics-port"))
    engine = int(flag(args, "--engine-port") or port)
    http = set(range(port, port + replicas)) if command == "serve" else set()
    return http | {engine} | ({metrics} if metrics else set())


def alive(pid: int) -> bool:
    """Whether pid runs (an exited process nobody reaped yet, a zombie, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def stop(record: dict) -> None:
    """SIGTERM the process group, SIGKILL what is left after 15 s, then the engine child
    a `serve` logged (it runs in a session of its own), and wait for the ports."""
    pids = [record["pid"]]
    with contextlib.suppress(OSError):
        pids += [int(p) for p in ENGINE_CHILD.findall(Path(record["log"]).read_text())]
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(record["pid"], signal.SIGTERM)
    with contextlib.suppress(AssertionError):  # still alive after 15 s: killed below
        wait_until(lambda: not any(alive(p) for p in pids), timeout=15, what="exit")
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(AssertionError):  # a port still held fails the next bind, loudly
        wait_until(lambda: all(port_free(p) for p in record["ports"]), timeout=10,
                   what="the ports free")


def records(run_dir: Path) -> list[dict]:
    path = run_dir / REGISTRY
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def save(run_dir: Path, kept: list[dict]) -> None:
    (run_dir / REGISTRY).write_text("".join(json.dumps(r) + "\n" for r in kept))


def stop_all(run_dir: Path) -> list[str]:
    """Stop every server the page's examples started; their logs, for a failure report."""
    logs = []
    for record in records(run_dir):
        stop(record)
        with contextlib.suppress(OSError):
            logs.append(Path(record["log"]).read_text())
    save(run_dir, [])
    return logs


def wait_ready(command: str, args: list[str], proc: subprocess.Popen, log: Path,
               timeout: float = 60.0) -> None:
    health = f"http://127.0.0.1:{flag(args, '--port')}/health"

    def ready() -> bool:  # its ready line logged (and, for serve, /health answering)
        if proc.poll() is not None:
            raise SystemExit(f"inference-lab {command} exited with {proc.returncode}:\n"
                             f"{log.read_text()[-3000:]}")
        if not READY[command].search(log.read_text()):
            return False
        if command != "serve":
            return True
        with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
            with urllib.request.urlopen(health, timeout=2) as resp:
                return resp.status == 200
        return False

    try:
        wait_until(ready, timeout=timeout, what="ready")
    except AssertionError:
        raise SystemExit(f"inference-lab {command} not ready within {timeout} s:\n"
                         f"{log.read_text()[-3000:]}") from None


def main(argv: list[str]) -> None:
    command, args = argv[0], argv[1:]
    if "-h" in args or "--help" in args:
        os.execv(sys.executable, [sys.executable, "-P", "-m", "inference_lab", *argv])
    ports = json.loads(os.environ["DOCS_PORTS"])
    run_dir = Path(os.environ["DOCS_RUN_DIR"])
    args = with_defaults(command, args, ports)
    own = ports_of(command, args)
    kept = []
    for record in records(run_dir):
        if own & set(record["ports"]):
            stop(record)
        else:
            kept.append(record)
    log = run_dir / f"{command}-{time.monotonic_ns()}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-P", "-m", "inference_lab", command, *args],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    save(run_dir, [*kept, {"pid": proc.pid, "ports": sorted(own), "log": str(log)}])
    try:
        wait_ready(command, args, proc, log)
    except SystemExit:
        stop({"pid": proc.pid, "ports": [], "log": str(log)})
        raise


if __name__ == "__main__":
    main(sys.argv[1:])
