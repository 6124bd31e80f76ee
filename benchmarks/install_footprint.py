"""Install footprint: what a plain `pip install .` costs and how fast `serve` starts after it.

Exports a commit (`git archive`, so the measured tree is exactly that commit's), installs it
into a fresh venv with `pip install DIR[EXTRAS]` (pip's cache used, as a user's would be)
and prints the install's wall seconds, the size of the venv's site-packages in MB
(`du -sm`), and `serve`'s start-up: the time from launching `inference-lab serve --port P`
to the first 200 from /health, the median of --starts runs. No pass/fail: a benchmark.

    python benchmarks/install_footprint.py [--ref REF] [--extras all] [--starts 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import _common as C


def export(ref: str, into: Path) -> Path:
    """The tree of `ref` unpacked under `into` (no build leftovers of a working copy)."""
    source = into / "src"
    source.mkdir()
    archive = subprocess.run(["git", "archive", ref], cwd=C.ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    return source


def install(source: Path, venv: Path, extras: str) -> float:
    """Wall seconds of `pip install SOURCE[EXTRAS]` into a fresh venv at `venv`."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    target = f"{source}[{extras}]" if extras else str(source)
    start = time.perf_counter()
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", target], check=True)
    return time.perf_counter() - start


def site_packages_mb(venv: Path) -> int:
    (site,) = venv.glob("lib/python*/site-packages")
    return int(subprocess.run(["du", "-sm", str(site)], check=True, text=True,
                              capture_output=True).stdout.split()[0])


def start_up(venv: Path, timeout: float = 60.0) -> float:
    """Seconds from launching `inference-lab serve` to the first 200 from /health."""
    port = C.free_port()
    url = f"http://127.0.0.1:{port}/health"
    start = time.perf_counter()
    proc = subprocess.Popen([str(venv / "bin" / "inference-lab"), "serve", "--host", "127.0.0.1",
                             "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while time.perf_counter() - start < timeout:
            if proc.poll() is not None:
                raise SystemExit(f"serve exited with {proc.returncode} before /health answered")
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return time.perf_counter() - start
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.02)
        raise SystemExit(f"{url} did not answer within {timeout} s")
    finally:
        C.stop_process(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", default="HEAD", help="the commit measured (git archive REF)")
    parser.add_argument("--extras", default="", help="extras installed too, e.g. all")
    parser.add_argument("--starts", type=int, default=5, help="serve start-ups (median)")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()

    commit = subprocess.run(["git", "rev-parse", "--short", args.ref], cwd=C.ROOT, check=True,
                            text=True, capture_output=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="install-footprint-") as tmp:
        venv = Path(tmp) / "venv"
        install_s = install(export(args.ref, Path(tmp)), venv, args.extras)
        size_mb = site_packages_mb(venv)
        starts = [start_up(venv) for _ in range(args.starts)]
    figures = {
        "commit": commit, "extras": args.extras or None, "install_s": round(install_s, 1),
        "site_packages_mb": size_mb, "serve_start_s_median": round(statistics.median(starts), 2),
        "serve_start_s": [round(s, 2) for s in starts], "host": C.host(),
    }
    print(f"{C.host()}; code at {commit}")
    print(f"pip install .{f'[{args.extras}]' if args.extras else ''}: {install_s:.1f} s, "
          f"site-packages {size_mb} MB")
    print(f"serve start-up to the first 200 from /health: median {figures['serve_start_s_median']} s"
          f" of {args.starts} ({', '.join(f'{s:.2f}' for s in starts)})")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
