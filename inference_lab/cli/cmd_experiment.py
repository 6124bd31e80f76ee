"""`inference-lab experiment`: run a capacity scenario against a server and report on it;
`inference-lab experiment compare DIR...`: several runs side by side.

Knows the flags and the private server's lifecycle (`--serve` starts `inference-lab serve`
on free loopback ports with the scenario's model config, and stops it afterwards, also when
the run is stopped: SIGTERM, as `timeout`, CI runners and Kubernetes send it, stops it as
Ctrl-C does; if this process is killed outright, the server's lifeline ends it:
common.lifeline). The experiment itself is inference_lab.experiments.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from inference_lab.cli.auth_flags import API_KEY_ENV, CONTROL_TOKEN_ENV
from inference_lab.common import lifeline

HELP = """\
Run a capacity experiment: a scenario TOML (load, controller, timeline of actions) against
a server over HTTP, then write DIR/requests.parquet (one row per request),
DIR/controller.parquet, DIR/server.parquet (queue gauges every 250 ms), DIR/summary.json
(per phase, with the offline simulator's oracle and the controller's scores) and
DIR/report.html (plots).

  inference-lab experiment configs/experiments/reference-page.toml --serve --out runs/ref
  inference-lab experiment configs/experiments/capacity-step.toml --serve --controller aimd --out runs/aimd
  inference-lab experiment compare runs/ref runs/aimd --out runs/compare
  inference-lab experiment configs/experiments/autoscaling-diurnal.toml --virtual --out runs/day
  inference-lab experiment configs/experiments/pd-ratio.toml --serve --out runs/pd-ratio

Controllers: fixed, aimd, vegas, gradient2, envoy, sre (published defaults; override
with --param NAME=VALUE). Autoscalers (a scenario with [fleet]): hpa, keda, slo, or
package.module:Class (--autoscaler, --autoscaler-param NAME=VALUE). With --url the
server's clock must run at --time-scale. --virtual runs the scenario on the simulated
clock against a simulated fleet, as fast as the CPU allows, writing the same files.
A P/D fleet ([fleet] kv_roles = "P:D", or a list of ratios, each run on a server of its
own with --serve, then DIR/report.html over them): each request's prefill goes to a
prefill replica, then the request with the returned kv_transfer_params to a decode one.
"""
READY_TIMEOUT_S = 60.0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("experiment", help="run a capacity experiment and report on it",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="SCENARIO.toml | compare",
                   help="the scenario to run, or `compare` followed by run directories")
    p.add_argument("dirs", nargs="*", metavar="DIR", help="with `compare`: the run directories")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--url", metavar="URL", help="the server to drive (e.g. http://127.0.0.1:8080)")
    where.add_argument("--serve", action="store_true",
                       help="start a private `inference-lab serve` for the run, stop it after")
    where.add_argument("--virtual", action="store_true",
                       help="no server: the same scenario on the simulated clock (virtual time)")
    p.add_argument("--data-parallel-size", type=int, metavar="D",
                   help="with --virtual: D data-parallel ranks per replica, behind vLLM's "
                        "internal balancer, an MoE model's in lockstep (overrides the "
                        "scenario's [server] data_parallel_size)")
    p.add_argument("--controller", metavar="NAME", help="override the scenario's controller")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="a controller parameter (repeatable), e.g. --param min_limit=1")
    p.add_argument("--autoscaler", metavar="NAME",
                   help="override the scenario's autoscaler (hpa, keda, slo, package.module:Class)")
    p.add_argument("--autoscaler-param", action="append", default=[], metavar="NAME=VALUE",
                   help="an autoscaler parameter (repeatable), e.g. --autoscaler-param target=16")
    p.add_argument("--time-scale", type=float, metavar="K",
                   help="the server's modelled clock runs K times faster than the wall "
                        "(default: the scenario's [server] time_scale, else 1)")
    p.add_argument("--metrics-url", metavar="URL",
                   help="the engine's Prometheus /metrics to scrape (default with --serve: its "
                        "own; with --url: GET /control/capacity on the server)")
    p.add_argument("--out", type=Path, required=False, metavar="DIR", help="output directory")
    p.set_defaults(func=run)


def _param(text: str) -> tuple[str, object]:
    from inference_lab.cli import UsageError

    name, sep, value = text.partition("=")
    if not sep or not name:
        raise UsageError(f"--param: expected NAME=VALUE, got {text!r}")
    for kind in (int, float):
        try:
            return name, kind(value)
        except ValueError:
            pass
    return name, value


class PrivateServer:
    """`inference-lab serve` on free loopback ports, for one run."""

    def __init__(self, scenario, time_scale: float, log_path: Path,
                 adapters: dict[str, str] | None = None, startup_delay: float = 0.0) -> None:
        self.argv = [sys.executable, "-P", "-m", "inference_lab", "--log-level", "WARNING",
                     "serve", "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0",
                     "--hardware", scenario.hardware, "--time-scale", repr(time_scale),
                     "--grace", "1"]
        if scenario.config is not None:
            self.argv += ["--config", str(scenario.config)]
        if scenario.kv_offloading_size is not None:
            self.argv += ["--kv-offloading-size", repr(scenario.kv_offloading_size)]
        if scenario.fleet is not None:  # the engine times start-ups on the wall: modelled / K
            self.argv += ["--replicas", str(max(scenario.fleet.replicas, 1)),
                          "--startup-delay", repr(startup_delay / time_scale),
                          "--max-waiting", str(scenario.max_waiting)]
        self.ranks = scenario.data_parallel_size
        if self.ranks > 1:  # one server of D ranks (internal balancing)
            self.argv += ["--data-parallel-size", str(self.ranks)]
        if scenario.pd is not None:  # a P/D fleet: the first P replicas prefill, the rest decode
            self.argv += ["--kv-roles", f"{scenario.pd[0]}:{scenario.pd[1]}"]
        if adapters:  # the load's LoRA adapters (the runner would load them otherwise)
            self.argv += ["--lora-modules", *(f"{n}={p}" for n, p in adapters.items()),
                          "--max-loras", str(scenario.workload.max_loras)]
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.metrics_url = ""

    def __enter__(self) -> "PrivateServer":
        env = {k: v for k, v in os.environ.items() if k not in (API_KEY_ENV, CONTROL_TOKEN_ENV)}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        # From the main thread (the server's lifeline fires when the forking thread exits);
        # a session of its own, so a terminal's Ctrl-C reaches only this process, which
        # stops the server in order.
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=self._log,
                                     stdin=subprocess.DEVNULL, env=lifeline.child_env(env),
                                     start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:  # a stop while it starts (Ctrl-C, SIGTERM) stops it too
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_ready(self) -> None:
        from inference_lab.cli import UsageError

        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline().decode(errors="replace")
            if not line:
                break
            self._log.write(line.encode())
            if m := re.search(r"metrics (\d+)", line):
                self.metrics_url = f"http://127.0.0.1:{m.group(1)}/metrics"
            if m := re.search(r"serving on (http://\S+:\d+)", line):
                self.url = m.group(1)
                break
        if not self.url:
            raise UsageError(f"--serve: the server did not start; its log: {self.log_path}")
        if self.ranks > 1:  # every rank's series: the API port's /metrics merges them
            self.metrics_url = self.url + "/metrics"
        # Keep reading its stdout so that it never blocks on a full pipe.
        self._drain = threading.Thread(target=shutil.copyfileobj, args=(self.proc.stdout, self._log),
                                       daemon=True)
        self._drain.start()

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        drain = getattr(self, "_drain", None)
        if drain is not None:
            drain.join(5)
        self._log.close()


def _run_scenario(args: argparse.Namespace) -> int:
    from inference_lab.cli import UsageError
    from inference_lab.cli.auth_flags import api_key, control_token
    from inference_lab.experiments.experiment import adapter_dirs, run_experiment
    from inference_lab.experiments.scenario import load_scenario

    if args.dirs:
        raise UsageError(f"unexpected arguments after the scenario: {' '.join(args.dirs)} "
                         "(did you mean `experiment compare DIR...`?)")
    if not args.url and not args.serve and not args.virtual:
        raise UsageError("give --url URL (a running server), --serve (start a private one) or "
                         "--virtual (no server: simulated time)")
    if args.out is None:
        raise UsageError("--out DIR is required")
    scenario = load_scenario(args.target)
    if args.data_parallel_size is not None:
        if not 1 <= args.data_parallel_size <= 64:
            raise UsageError(f"--data-parallel-size: expected an integer in [1, 64], got "
                             f"{args.data_parallel_size}")
        scenario = dataclasses.replace(scenario, data_parallel_size=args.data_parallel_size)
    if args.controller or args.param:
        params = dict(_param(p) for p in args.param)
        scenario = scenario.with_controller(args.controller or scenario.controller,
                                            params if args.param else None)
    if args.autoscaler or args.autoscaler_param:
        params = dict(_param(p) for p in args.autoscaler_param)
        if not (args.autoscaler or scenario.autoscaler):
            raise UsageError("--autoscaler-param: the scenario has no autoscaler (give --autoscaler)")
        scenario = scenario.with_autoscaler(args.autoscaler or scenario.autoscaler,
                                            params if args.autoscaler_param else None)
    from inference_lab.autoscale.registry import make_autoscaler
    from inference_lab.experiments.controllers import make_controller

    try:
        make_controller(scenario.controller, scenario.controller_params)  # refuse bad input now
        if scenario.autoscaler:
            make_autoscaler(scenario.autoscaler, scenario.autoscaler_params, lambda: 1.0)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    scale = args.time_scale if args.time_scale is not None else scenario.time_scale
    if not 0 < scale <= 1000:
        raise UsageError(f"--time-scale: expected a number > 0 and <= 1000, got {scale}")
    out: Path = args.out
    if len(scenario.ratios) > 1 and not args.serve:
        raise UsageError(f"{scenario.path}: fleet.kv_roles: a sweep of {len(scenario.ratios)} P:D "
                         "ratios needs --serve (each ratio runs on a server of its own)"
                         if args.url else
                         f"{scenario.path}: fleet.kv_roles: virtual time does not model a P/D fleet "
                         "(run it with --serve or --url)")
    if scenario.data_parallel_size > 1 and args.url:
        raise UsageError(f"{scenario.path}: server.data_parallel_size: the server at --url has "
                         "the ranks it was started with (`inference-lab serve "
                         "--data-parallel-size D`); run it with --serve or --virtual")
    if scenario.data_parallel_size > 1 and scenario.fleet is not None and not args.virtual:
        raise UsageError(f"{scenario.path}: server.data_parallel_size: a served fleet's replicas "
                         "are independent servers, not data-parallel ranks (run a fleet of "
                         "ranked replicas with --virtual)")
    if scenario.data_parallel_size > 1 and scenario.ratios:
        raise UsageError(f"{scenario.path}: server.data_parallel_size: not with a P/D fleet "
                         "(fleet.kv_roles)")
    if len(scenario.ratios) > 1:
        return _pd_sweep(args, scenario, scale)

    def progress(line: str) -> None:
        print(f"  {line}", flush=True)

    def go(url: str, metrics_url: str | None) -> dict:
        print(f"running {scenario.name} ({scenario.duration:g} modelled s, "
              f"{scenario.duration / scale:.1f} s on the wall) with {_who(scenario)} "
              f"against {url}", flush=True)
        try:
            import uvloop
            runner = uvloop.run
        except ImportError:
            runner = asyncio.run
        return runner(run_experiment(
            scenario, url, out, time_scale=scale, metrics_url=metrics_url,
            api_key=api_key(args) if not args.serve else None,
            control_token=control_token(args) if not args.serve else None,
            on_progress=progress))

    try:
        if args.virtual:
            from inference_lab.experiments.experiment import run_virtual

            print(f"running {scenario.name} ({scenario.duration:g} modelled s) in virtual time "
                  f"with {_who(scenario)}", flush=True)
            summary = run_virtual(scenario, out, progress)
            run = summary["virtual_run"]
            print(f"  {scenario.duration:g} modelled s in {run['wall_s']:.1f} s "
                  f"({run['speed']:,.0f} x real time, {run['engine_steps']:,} engine steps)")
        elif args.serve:
            from inference_lab.experiments.experiment import replica_startup_delay

            with PrivateServer(scenario, scale, out / "server.log", adapter_dirs(scenario, out),
                               replica_startup_delay(scenario)) as server:
                summary = go(server.url, args.metrics_url or server.metrics_url)
        else:
            summary = go(args.url, args.metrics_url)
    except (OSError, RuntimeError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if "pd" in summary:
        _print_pd(summary["pd"])
        print(f"wrote {out / 'report.html'} and {out / 'summary.json'}")
        return 0
    if "autoscaling" in summary:
        _print_autoscaling(summary)
        print(f"wrote {out / 'report.html'} and {out / 'summary.json'}")
        return 0
    for p in summary["phases"]:
        s, sc = p["steady"], p["scores"]
        e2e = f"{s['e2e_p50_s'] * 1000:.0f}" if s["e2e_p50_s"] is not None else "-"
        print(f"  phase {p['index']} ({p['action']}): limit p50 {s['limit_p50']}, "
              f"goodput {s['goodput_tok_s']:.0f} tok/s (oracle {p['oracle']['goodput_tok_s']:.0f}), "
              f"e2e p50 {e2e} ms, 529 {100 * s['frac_529']:.1f} %, "
              f"score goodput {sc['goodput'] or 0:.2f}"
              + (f", cached {100 * s['cached_frac']:.0f} % (oracle "
                 f"{100 * (p['oracle']['cache_hit_rate'] or 0):.0f} %)"
                 if scenario.workload.structured and s["cached_frac"] is not None else ""))
    print(f"wrote {out / 'report.html'} and {out / 'summary.json'}")
    return 0


def _pd_sweep(args: argparse.Namespace, scenario, scale: float) -> int:
    """One run per P:D ratio, each on a private server of that layout, then one page."""
    from inference_lab.cli import UsageError
    from inference_lab.experiments.experiment import pd_run_dir, pd_sweep, run_experiment

    try:
        import uvloop
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    for ratio in scenario.ratios:
        sc = scenario.with_ratio(ratio)
        out = pd_run_dir(args.out, ratio)
        print(f"running {sc.name} with P:D {ratio[0]}:{ratio[1]} ({sc.duration:g} modelled s, "
              f"{sc.duration / scale:.1f} s on the wall)", flush=True)
        try:
            with PrivateServer(sc, scale, out / "server.log") as server:
                summary = runner(run_experiment(sc, server.url, out, time_scale=scale,
                                                metrics_url=args.metrics_url or server.metrics_url))
        except (OSError, RuntimeError, ValueError) as exc:
            raise UsageError(str(exc)) from None
        _print_pd(summary["pd"])
    pd_sweep(scenario, args.out)
    print(f"wrote {args.out / 'report.html'} and {args.out / 'summary.json'}")
    return 0


def _print_pd(pd: dict) -> None:
    def ms(d: dict, q: str, digits: int = 1) -> str:
        return f"{d[q]:.{digits}f}" if d[q] is not None else "-"

    print(f"  P:D {pd['kv_roles']}: {pd['completed']} of {pd['requests']} completed; "
          f"TTFT p50 {ms(pd['ttft_ms'], 'p50')} p99 {ms(pd['ttft_ms'], 'p99')} ms, "
          f"TPOT p50 {ms(pd['tpot_ms'], 'p50', 2)} p99 {ms(pd['tpot_ms'], 'p99', 2)} ms; "
          f"{pd['external_hits']:,.0f} positions received by transfer, "
          f"{pd['recomputed']:.0f} recomputed", flush=True)


def _who(scenario) -> str:
    if scenario.autoscaler:
        return f"autoscaler {scenario.autoscaler}"
    return f"controller {scenario.controller}"


def _print_autoscaling(summary: dict) -> None:
    a = summary["autoscaling"]
    oracle = a.get("oracle") or {}
    att = f"{100 * a['attainment']:.2f} %" if a.get("attainment") is not None else "-"
    print(f"  SLO attainment {att}, {a['gpu_hours']:.2f} GPU-hours "
          f"(mean {a['mean_replicas'] or 0:.2f}, peak {a['peak_replicas']} replicas), "
          f"{a['cold_starts']} cold starts, {a['n_529']} 529s, {a['n_503']} 503s")
    if oracle:
        cost = f"{a['cost_vs_oracle']:.2f} x" if a.get("cost_vs_oracle") else "-"
        print(f"  oracle: {oracle['gpu_hours']:.2f} GPU-hours at {oracle['capacity_rps']:.1f} "
              f"requests/s per replica; cost vs oracle {cost}")


def _compare(args: argparse.Namespace) -> int:
    from inference_lab.cli import UsageError
    from inference_lab.experiments.experiment import compare
    from inference_lab.experiments.records import RunFileError

    if not args.dirs:
        raise UsageError("compare: give one or more run directories")
    out = args.out or Path("compare")
    try:
        path = compare([Path(d) for d in args.dirs], out)
    except (FileNotFoundError, RunFileError) as exc:
        raise UsageError(str(exc)) from None
    print(f"wrote {path}")
    return 0


def _stop_on_sigterm() -> list[int]:
    """SIGTERM stops a run as Ctrl-C does (the same handler, whichever is installed:
    asyncio's while the run's loop runs, else the one that raises KeyboardInterrupt), so
    the private server is stopped in order. The list receives the signal's number."""
    received: list[int] = []

    def on_sigterm(signum: int, frame) -> None:
        received.append(signum)
        # Once stopping, a second SIGTERM must not cut the server's stop short (a kill
        # still ends this process, and the server's lifeline the server).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        handler = signal.getsignal(signal.SIGINT)
        if not callable(handler):  # (SIGINT ignored or default: the run still ends)
            raise KeyboardInterrupt
        handler(signal.SIGINT, frame)

    signal.signal(signal.SIGTERM, on_sigterm)
    return received


def run(args: argparse.Namespace) -> int:
    from inference_lab.common.extras import require_extra

    require_extra("experiments", "experiments need")  # refused before a run, not after it
    if args.target == "compare":
        return _compare(args)
    received = _stop_on_sigterm()
    try:
        return _run_scenario(args)
    except KeyboardInterrupt:
        if received:  # 128 + the signal, as a shell reports it
            print("stopped by SIGTERM", file=sys.stderr, flush=True)
            return 128 + received[0]
        raise
