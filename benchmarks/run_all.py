"""Run the benchmarks of BENCHMARKS.md and refresh its tables.

    python benchmarks/run_all.py --list
    python benchmarks/run_all.py [--only NAME[,NAME]] [--write] [--quick] [--file PATH] [--json FILE]

Each benchmark in REGISTRY is one or more commands of a script in this folder; each is run
as its own process with `--json FILE` (its report still prints as it goes), and the
figures it wrote become the rows of one table: what, figure, target, met. Without
`--write` the tables are printed; with it, each benchmark's table in BENCHMARKS.md (between
`<!-- bench:NAME -->` and `<!-- /bench:NAME -->`) is replaced as soon as that benchmark
has run, with the command, the commit (`+dirty` when tracked files other than
BENCHMARKS.md differ from it) and the machine. Text outside the markers is kept as is; a
missing marker stops the run before anything is measured. `--quick` runs every command
with short durations to check that the scripts and the parsing work: its figures are not
results, so it writes only to another file (`--file`). The figures mean most on a quiet
machine: each script prints the load average and the CPU other processes took.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common as C
from _registry import REGISTRY, Argv, Bench
from _tables import MarkerError, block_names, render, replace_block

RESULTS = C.ROOT / "BENCHMARKS.md"


# ---- running -------------------------------------------------------------------------------------
def shown(argv: Argv) -> str:
    return shlex.join(("python", *argv))


def run_command(argv: Argv) -> dict | None:
    """Run one command with its JSON written to a temporary file; its figures, or None."""
    fd, path = tempfile.mkstemp(suffix=".bench.json")
    os.close(fd)
    try:
        print(f"\n$ {shown(argv)}", flush=True)
        done = subprocess.run([sys.executable, *argv, "--json", path], cwd=C.ROOT)
        if done.returncode != 0:
            print(f"(exited with {done.returncode})", flush=True)
            return None
        with open(path) as f:
            text = f.read()
        return json.loads(text) if text.strip() else None
    finally:
        os.unlink(path)


def select(only: str | None) -> list[Bench]:
    if not only:
        return list(REGISTRY)
    by_name = {b.name: b for b in REGISTRY}
    wanted = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        sys.exit(f"unknown benchmark(s): {', '.join(unknown)} (see --list)")
    return [by_name[n] for n in wanted]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--only", metavar="NAME[,NAME]", help="run these benchmarks only")
    parser.add_argument("--write", action="store_true",
                        help="replace each benchmark's table in the results file")
    parser.add_argument("--quick", action="store_true",
                        help="short durations, to check the scripts (not results)")
    parser.add_argument("--file", type=Path, default=RESULTS,
                        help="the results file (default BENCHMARKS.md)")
    parser.add_argument("--json", metavar="FILE", help="also write every figure here")
    args = parser.parse_args(argv)
    benches = select(args.only)
    if args.list:
        for b in benches:
            print(f"{b.name:<24} ~{b.minutes:g} min  {b.measures}")
            for c in b.commands:
                print(f"{'':<24}   {shown(c)}")
        print(f"\nabout {sum(b.minutes for b in benches):.0f} minutes in all")
        return 0
    if args.write:
        if args.quick and args.file.resolve() == RESULTS.resolve():
            sys.exit("--quick figures are not results: write them to another file (--file)")
        try:
            present = block_names(args.file.read_text())
        except (OSError, MarkerError) as e:
            sys.exit(f"{args.file}: {e}")
        missing = [b.name for b in benches if present.count(b.name) != 1]
        if missing:
            sys.exit(f"{args.file}: no single <!-- bench:NAME --> block for {', '.join(missing)}")
    commit, machine = C.commit(), C.host()
    print(f"machine: {machine}; code at {commit}", flush=True)
    everything, failed = {}, []
    for b in benches:
        C.print_load(b.name)
        started = time.monotonic()
        commands = b.quick if args.quick and b.quick else b.commands
        results = []
        for argv_ in commands:
            result = run_command(argv_)
            if result is None:
                break
            results.append(result)
        if len(results) != len(commands):
            failed.append(b.name)
            continue
        try:
            rows = b.rows(results)
        except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as e:
            print(f"{b.name}: its figures could not be read ({type(e).__name__}: {e})")
            failed.append(b.name)
            continue
        body = render(rows, commands=[shown(c) for c in commands], commit=commit,
                      machine=machine)
        everything[b.name] = results
        print(f"\n== {b.name} ({time.monotonic() - started:.0f} s)\n{body}\n", flush=True)
        if args.write:
            args.file.write_text(replace_block(args.file.read_text(), b.name, body))
            print(f"(written to {args.file})", flush=True)
    C.write_json(args.json, {"machine": machine, "commit": commit, "results": everything})
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
