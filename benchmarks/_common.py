"""Shared plumbing of the benchmarks: CPU accounting, metrics, statistics, load generators.
The processes (`serve`, `engine`, `gateway`) come from inference_lab.testing.launch, the
launcher the tests use too.

Everything listens on 127.0.0.1 on free ports; every process started here is stopped by
the context manager or `stop_all` that started it, also on Ctrl-C or an exception.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from inference_lab.common.ports import free_port  # noqa: F401 (the benchmarks' C.free_port)
from inference_lab.testing.launch import (  # noqa: F401 (one launcher for tests and benchmarks)
    Served,
    serve,
    stop_process,
    wait_http_ok,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LOADGEN = HERE / "_loadgen.py"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---- machine ---------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def commit(ignore: tuple[str, ...] = ("BENCHMARKS.md",)) -> str:
    """The commit measured (`git rev-parse --short HEAD`), with "+dirty" when a tracked
    file other than `ignore` differs from it (the results file is not the code measured)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, timeout=10).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                 cwd=ROOT, text=True, capture_output=True,
                                 timeout=10).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    dirty = [line for line in changed if line[3:].strip() not in ignore]
    return f"{head}{'+dirty' if dirty else ''}" if head else "unknown"


def host() -> str:
    """The machine without the code: CPUs, Python, kernel."""
    return (f"{os.cpu_count()} CPUs ({cpu_model()}), Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}")


def machine() -> str:
    return f"{host()}; code at {commit()}"


def load_average() -> list[str]:
    """The 1, 5 and 15 minute load averages, as /proc/loadavg writes them."""
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


def loadavg() -> str:
    return " ".join(load_average())


def print_load(label: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] load average before {label}: {loadavg()}", flush=True)


# ---- processes -------------------------------------------------------------------------------
def proc_cpu(pid: int) -> float:
    """utime + stime of a live process (all its threads), in seconds; NaN once gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return float("nan")


def machine_busy() -> float:
    """CPU-seconds the whole machine has been busy (user+nice+system+irq+softirq+steal)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def cpu_snapshot(pids: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds of each named group of processes, plus "machine" (the whole machine's
    busy time; machine minus the groups is what other processes used meanwhile)."""
    snap = {name: sum(proc_cpu(p) for p in ps) for name, ps in pids.items()}
    snap["machine"] = machine_busy()
    return snap


def others(cpu_delta: dict[str, float]) -> float:
    """CPU seconds used by processes outside the benchmark's groups (incl. this one)."""
    return cpu_delta["machine"] - sum(v for k, v in cpu_delta.items() if k != "machine")


def start_loadgens(configs: list[dict]) -> list[subprocess.Popen]:
    """One `_loadgen.py` process per config; each writes its JSON result to a temp file."""
    procs = []
    for cfg in configs:
        fd, path = tempfile.mkstemp(suffix=".loadgen.json")
        os.close(fd)
        proc = subprocess.Popen([sys.executable, str(LOADGEN), json.dumps({**cfg, "out": path})],
                                stdin=subprocess.DEVNULL, cwd=ROOT)
        proc.result_path = path  # type: ignore[attr-defined]
        procs.append(proc)
    return procs


def collect_loadgens(procs: list[subprocess.Popen], timeout: float) -> list[dict]:
    out = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            raise RuntimeError("a load generator did not finish in time")
        if p.returncode != 0:
            raise RuntimeError(f"load generator exited with {p.returncode}")
        with open(p.result_path) as f:  # type: ignore[attr-defined]
            out.append(json.load(f))
        os.unlink(p.result_path)  # type: ignore[attr-defined]
    return out


def stop_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
        path = getattr(p, "result_path", None)
        if path:
            with contextlib.suppress(OSError):
                os.unlink(path)


def stream_arguments(doc: str, clients: int, seconds: float) -> argparse.ArgumentParser:
    """The flags of a benchmark that streams to N clients for a while: --clients,
    --seconds, --max-tokens (a parser the benchmark may add to)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--clients", type=int, default=clients)
    parser.add_argument("--seconds", type=float, default=seconds)
    parser.add_argument("--max-tokens", type=int, default=200)
    return parser


def add_window_arguments(parser: argparse.ArgumentParser, *, warmup: float,
                         duration: float) -> None:
    """--warmup and --duration: the seconds of load before the measured window, and the
    window's."""
    parser.add_argument("--warmup", type=float, default=warmup,
                        help=f"seconds of load before the measured window (default {warmup:g})")
    parser.add_argument("--duration", type=float, default=duration,
                        help=f"measured seconds (default {duration:g})")


def split(n: int, k: int) -> list[int]:
    return [n // k + (1 if i < n % k else 0) for i in range(k)]


# ---- statistics ------------------------------------------------------------------------------
def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return float("nan")
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def histogram(text: str, name: str) -> tuple[list[tuple[float, float]], float, float]:
    """Cumulative buckets [(le, count)], _count and _sum of a Prometheus histogram
    (summed over label sets other than `le`)."""
    from prometheus_client.parser import text_string_to_metric_families

    buckets: dict[float, float] = {}
    count = total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for s in family.samples:
            if s.name.endswith("_bucket"):
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
            elif s.name.endswith("_count"):
                count += s.value
            elif s.name.endswith("_sum"):
                total += s.value
    return sorted(buckets.items()), count, total


def counter(text: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    value = 0.0
    for family in text_string_to_metric_families(text):
        if family.name == name:
            value += sum(s.value for s in family.samples if s.name.endswith("_total")
                         or s.name == name)
    return value


def histogram_delta(before, after):
    b = dict(before[0])
    return [(le, c - b.get(le, 0.0)) for le, c in after[0]], after[1] - before[1], after[2] - before[2]


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> tuple[float, bool]:
    """Prometheus-style: linear within the bucket holding rank q*total. Returns (value,
    overflow) where overflow means the rank fell in +Inf (value = highest finite bound)."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return float("nan"), False
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if le == float("inf"):
                return prev_le, True
            if c == prev_c:
                return le, False
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c), False
        prev_le, prev_c = le, c
    return prev_le, True


# ---- a measured window -------------------------------------------------------------------------
def measure_window(served: "Served", loadgens: list[subprocess.Popen], start: float, stop: float,
                   *, profile: str | None, duration: float, suffix: str,
                   collect_timeout: float) -> tuple[dict, str, str, float, list[dict], dict]:
    """Wait until monotonic `start`, then measure until `stop`: CPU of the gateway, the
    engine and the load generators (plus "others"), the engine's /metrics at both ends,
    py-spy of engine and gateway when `profile` is a directory. Returns (cpu, metrics
    before, metrics after, wall seconds, the load generators' results, {process: py-spy
    output file})."""
    pids = {"gateway": [served.gateway_pid, *served.api_server_pids()],
            "engine": sorted(set(served.engine_pids())) or [served.engine_pid],
            "loadgen": [p.pid for p in loadgens]}
    time.sleep(max(0.0, start - time.monotonic()))
    spies = start_profiles(profile, pids, duration, suffix)
    try:
        cpu0, m0, w0 = cpu_snapshot(pids), served.engine_metrics(), time.monotonic()
        time.sleep(max(0.0, stop - time.monotonic()))
        cpu1, m1, w1 = cpu_snapshot(pids), served.engine_metrics(), time.monotonic()
        results = collect_loadgens(loadgens, timeout=collect_timeout)
        for _, _, spy in spies:
            try:
                spy.wait(timeout=30)
            except Exception:
                spy.kill()
    finally:
        stop_all([spy for _, _, spy in spies])
    cpu = {k: cpu1[k] - cpu0[k] for k in cpu0}
    cpu["others"] = others(cpu)
    return cpu, m0, m1, w1 - w0, results, {name: out for name, out, _ in spies}


# ---- py-spy ----------------------------------------------------------------------------------
def start_profiles(directory: str | None, pids: dict[str, list[int]], seconds: float,
                   suffix: str) -> list[tuple[str, str, subprocess.Popen]]:
    """py-spy the engine and the gateway for `seconds` when `directory` is given:
    [(name, output file, py-spy process)]."""
    spies = []
    if directory:
        os.makedirs(directory, exist_ok=True)
        for name in ("engine", "gateway"):
            out = os.path.join(directory, f"{name}-{suffix}.txt")
            spy = start_pyspy(pids[name][0], seconds, out)
            if spy is not None:
                spies.append((name, out, spy))
    return spies


def start_pyspy(pid: int, seconds: float, out: str, rate: int = 100) -> subprocess.Popen | None:
    """`py-spy record --format raw` (collapsed stacks) of `pid`, non-blocking; None when
    py-spy is not installed."""
    import shutil

    exe = shutil.which("py-spy")
    if exe is None:
        print("py-spy not found (pip install py-spy): no profile", flush=True)
        return None
    return subprocess.Popen(
        [exe, "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))),
         "--rate", str(rate), "--format", "raw", "--nonblocking", "-o", out],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)


def _short(frame: str) -> str:
    # py-spy raw frames look like "func (path/to/file.py:123)"; drop the line number
    m = re.match(r"(.*) \((.*?)(?::\d+)?\)$", frame)
    if not m:
        return frame
    func, path = m.groups()
    parts = Path(path).parts
    for anchor in ("site-packages", "main", "lib"):
        if anchor in parts:
            idx = len(parts) - 1 - parts[::-1].index(anchor)
            path = "/".join(parts[idx + 1:])
            break
    return f"{func} ({path})"


def summarize_profile(path: str, top: int = 15) -> str:
    """Top functions by self and by inclusive share of the sampled (non-idle) stacks."""
    own: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return f"(no profile at {path})"
    for line in lines:
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        total += count
        frames = [_short(fr) for fr in stack.split(";")]
        frames = [fr for fr in frames if not fr.startswith("process ")
                  and not fr.startswith("thread ")]
        if not frames:
            continue
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for fr in set(frames):
            incl[fr] = incl.get(fr, 0) + count
    if not total:
        return "(empty profile)"
    rows = [f"  {total} samples (non-idle)", "  self %  function"]
    rows += [f"  {100 * c / total:5.1f}  {fr}"
             for fr, c in sorted(own.items(), key=lambda kv: -kv[1])[:top]]
    rows += ["  incl %  function"]
    rows += [f"  {100 * c / total:5.1f}  {fr}"
             for fr, c in sorted(incl.items(), key=lambda kv: -kv[1])[:top]]
    return "\n".join(rows)


def llama70b_server() -> str:
    """The [server] table of the autoscaling scenarios: llama-3.1-70b on an H100, 64
    running and 128 waiting per replica."""
    return (f'[server]\nconfig = "{ROOT / "configs" / "llama-3.1-70b.toml"}"\nhardware = "h100"\n'
            "max_num_seqs = 64\nmax_waiting = 128")


def write_json(path: str | None, data: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=1, default=str)
