"""`inference-lab sim`: the offline simulation, as fast as the CPU allows."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from inference_lab.cli import UsageError
from inference_lab.engine.sim.kv_transfer import PD_POLICIES
from inference_lab.cli.engine_profile_flags import add_engine_profile_arguments
from inference_lab.cli.offload_flags import add_offload_arguments, flagged
from inference_lab.cli.catalog_flags import (
    add_catalog_argument, add_kv_cache_dtype_argument, add_timing_argument, build_catalog,
)

HELP = """\
Run a workload through the simulated engine offline: no server, no wall clock. The
simulated clock jumps from event to event, so a run of 100,000 requests takes seconds.
Prints TTFT, end-to-end and per-token latency (mean, p50, p90, p99), throughput and
preemptions; -o also writes them as JSON.

example:
  inference-lab sim --config configs/gpt-oss-20b.toml --hardware b200 \\
      --workload configs/workloads/chat-closed-loop-24.toml -o out.json

disaggregated (1 prefill replica, 3 decode replicas, KV pulled over RDMA):
  inference-lab sim -c configs/gpt-oss-20b.toml \\
      -w configs/workloads/chat-closed-loop-24.toml --pd 1:3 --kv-link rdma

data parallel (4 ranks behind vLLM's internal balancer; an MoE model's ranks step in
lockstep, idle ranks running one-token dummy passes):
  inference-lab sim -c configs/gpt-oss-20b.toml \
      -w configs/workloads/chat-closed-loop-24.toml --data-parallel-size 4
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sim", help="simulate a workload offline and report latency and throughput",
        description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-c", "--config", required=True, type=Path,
                   help="deployment config file, or a directory of them (then --model picks one)")
    p.add_argument("--hardware", default=None,
                   help="hardware entry of the config: a preset name (default: the file's only "
                        "[hardware.*] entry, else b200)")
    p.add_argument("-w", "--workload", required=True, type=Path,
                   help="workload TOML ([workload] table: arrival_pattern, num_requests, ...)")
    p.add_argument("--model", help="served model name when --config holds several")
    p.add_argument("-o", "--output", type=Path, help="write the summary as JSON to this file")
    p.add_argument("--seed", type=int, help="override the workload's seed")
    p.add_argument("--max-num-seqs", type=int, help="override the scheduler's max_num_seqs")
    p.add_argument("--max-waiting", type=int, help="override max_waiting (0 = unbounded)")
    add_engine_profile_arguments(p)
    p.add_argument("-q", "--no-progress", "--quiet", dest="no_progress", action="store_true",
                   help="do not show a progress bar")
    p.add_argument("-t", "--tokenizer", metavar="PATH", default=None,
                   help="a Hugging Face tokenizer.json for a workload's dataset_path prompts "
                        "(default: the built-in tokenizer, 4 UTF-8 bytes per token)")
    p.add_argument("--pd", metavar="P:D|off",
                   help="prefill/decode disaggregation: P prefill replicas and D decode "
                        "replicas behind a P/D router (overrides the config's [pd]; off: none)")
    p.add_argument("--kv-link", metavar="nvlink|rdma|GBPS[@MS]",
                   help="with --pd: the link a decode replica pulls KV over (default: the "
                        "config's [pd] link, else rdma)")
    p.add_argument("--pd-policy", choices=PD_POLICIES,
                   help="with --pd: how the router picks a replica of each pool "
                        "(default: the config's, else least_loaded)")
    p.add_argument("-dp", "--data-parallel-size", dest="data_parallel_size", type=int,
                   default=1, metavar="D",
                   help="run D data-parallel ranks of the deployment, as vLLM's "
                        "--data-parallel-size: each its own scheduler, KV cache and "
                        "max_waiting; requests routed by vLLM's internal balancer (score "
                        "4 x waiting + running, counts published every 100 ms); an MoE "
                        "model's ranks step in lockstep (each step as long as the slowest "
                        "rank's, idle ranks run one-token dummy passes), a dense model's "
                        "independently (default 1)")
    add_catalog_argument(p)
    add_timing_argument(p)
    add_kv_cache_dtype_argument(p)
    add_offload_arguments(p)
    p.set_defaults(func=run)


def _hardware(args: argparse.Namespace) -> str:
    """--hardware, or as inference-lab: the config file's only [hardware.*] entry; b200
    for a directory or a file with several entries."""
    if args.hardware is not None:
        return args.hardware
    if args.config.is_file():
        from inference_lab.common.toml import read_toml

        entries = read_toml(args.config).get("hardware")
        if isinstance(entries, dict) and len(entries) == 1:
            return next(iter(entries))
    return "b200"


def pick_deployment(args: argparse.Namespace):
    from inference_lab.engine.sim.config import load_config_dir

    args.hardware = _hardware(args)
    deployments = flagged(args, load_config_dir(args.config, args.hardware, args.max_waiting,
                                                build_catalog(args), args.timing,
                                                args.kv_cache_dtype))
    if args.model:
        chosen = [d for d in deployments if d.name == args.model]
        if not chosen:
            names = ", ".join(d.name for d in deployments)
            raise UsageError(f"no model {args.model!r} in {args.config} for {args.hardware} "
                             f"(have: {names})")
        return chosen[0]
    if len(deployments) > 1:
        names = ", ".join(d.name for d in deployments)
        raise UsageError(f"{args.config} holds several models ({names}): pick one with --model")
    return deployments[0]


def pd_layout(args: argparse.Namespace, deployment):
    """The disaggregated layout to simulate: --pd / --kv-link / --pd-policy over the
    config's [pd]; None for a single replica."""
    from inference_lab.engine.sim.kv_transfer import PdLayout, link_preset, parse_pools

    layout = deployment.pd
    if args.pd is not None:
        if args.pd.strip().lower() == "off":
            layout = None
        else:
            try:
                p, d = parse_pools(args.pd)
            except ValueError as exc:
                raise UsageError(f"--pd: {exc}") from None
            layout = PdLayout(p, d, *((layout.link, layout.policy) if layout else ()))
    if layout is None:
        for flag, value in (("--kv-link", args.kv_link), ("--pd-policy", args.pd_policy)):
            if value is not None:
                raise UsageError(f"{flag}: needs a disaggregated deployment (--pd P:D, or a "
                                 "[pd] table in the config)")
        return None
    if args.kv_link is not None:
        try:
            link_preset(args.kv_link, deployment.hardware)
        except ValueError as exc:
            raise UsageError(f"--kv-link: {exc}") from None
        layout = dataclasses.replace(layout, link=args.kv_link)
    if args.pd_policy is not None:
        layout = dataclasses.replace(layout, policy=args.pd_policy)
    return layout


def print_pools(summary: dict) -> None:
    """A disaggregated run's pools: where a request's time goes, and their KV use."""
    from rich.console import Console
    from rich.table import Table

    pd = summary["pd"]
    link = pd["link"]
    table = Table(title=f"{pd['prefill_replicas']} prefill : {pd['decode_replicas']} decode "
                        f"replicas, KV over {link['name']} ({link['bandwidth_gb_per_s']:g} GB/s, "
                        f"{link['latency_ms']:g} ms), {pd['policy']}")
    table.add_column("pool latency (ms)")
    for col in ("mean", "p50", "p90", "p99"):
        table.add_column(col, justify="right")
    rows = (("prefill", "queue", "queue_ms"), ("prefill", "prefill", "prefill_ms"),
            ("prefill", "TTFT", "ttft_ms"), ("decode", "transfer", "transfer_ms"),
            ("decode", "queue", "queue_ms"), ("decode", "TTFT", "ttft_ms"),
            ("decode", "per token", "per_token_ms"))
    for pool, label, key in rows:
        lat = pd[pool]["latency_metrics"][key]
        table.add_row(f"{pool}: {label}", *(f"{lat[c]:.2f}" for c in ("mean", "p50", "p90", "p99")))
    console = Console()
    console.print(table)
    tr = pd["transfers"]
    lines = [f"{pool} pool KV cache: mean {pd[pool]['utilization']['avg_kv_cache_util']:.1%}, "
             f"peak {pd[pool]['utilization']['peak_kv_cache_util']:.1%}; "
             f"{pd[pool]['steps']:,} steps" for pool in ("prefill", "decode")]
    lines.append(f"transfers: {tr['pulled']:,} pulled ({tr['external_tokens']:,} tokens), "
                 f"{tr['recomputed']:,} recomputed")
    console.print("\n".join(lines))


def print_ranks(summary: dict) -> None:
    """A data-parallel run's ranks: what the balancer sent each, what it admitted, its
    latencies; and the lockstep's dummy passes."""
    from rich.console import Console
    from rich.table import Table

    dp = summary["data_parallel"]
    mode = "lockstep (MoE)" if dp["lockstep"] else "independent (dense)"
    table = Table(title=f"{dp['size']} data-parallel ranks, {mode}")
    for col in ("rank", "requests", "admitted", "refused", "completed", "TTFT p50 (ms)",
                "e2e p50 (ms)", "steps"):
        table.add_column(col, justify="right")
    for r in dp["ranks"]:
        table.add_row(str(r["rank"]), f"{r['requests']:,}", f"{r['admitted']:,}",
                      f"{r['refused']:,}", f"{r['completed']:,}", f"{r['ttft_p50_ms']:.2f}",
                      f"{r['e2e_p50_ms']:.2f}", f"{r['steps']:,}")
    console = Console()
    console.print(table)
    line = f"balancer: {dp['publications']:,} publications of the ranks' counts"
    if dp["lockstep"]:
        line += (f"; {dp['aligned_steps']:,} aligned steps, "
                 f"{dp['dummy_passes']:,} dummy passes")
    console.print(line)


def print_table(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    lat = summary["latency_metrics"]
    table = Table(title=f"{summary['model']} on {summary['hardware']} (simulated)")
    table.add_column("latency (ms)")
    for col in ("mean", "p50", "p90", "p99"):
        table.add_column(col, justify="right")
    for label, key in (("TTFT", "ttft_ms"), ("end to end", "e2e_ms"), ("per token", "per_token_ms")):
        table.add_row(label, *(f"{lat[key][c]:.2f}" for c in ("mean", "p50", "p90", "p99")))
    console = Console()
    console.print(table)
    thr, req, sim = summary["throughput_metrics"], summary["requests"], summary["simulation"]
    util = summary["utilization"]
    console.print(
        f"throughput: {thr['output_tokens_per_sec']:,.0f} output tok/s, "
        f"{thr['input_tokens_per_sec']:,.0f} input tok/s, {thr['requests_per_sec']:,.2f} req/s\n"
        f"requests: {req['completed']:,} completed of {req['total']:,} "
        f"({req['rejected_queue_saturated']:,} refused: queue saturated, "
        f"{req['rejected_invalid']:,} invalid); preemptions: {summary['preemptions']['total']:,}\n"
        f"utilization (mean over steps): KV cache {util['avg_kv_cache_util']:.1%}, "
        f"FLOPs {util['avg_flops_util']:.1%}, bandwidth {util['avg_bandwidth_util']:.1%}\n"
        f"simulated {sim['simulated_seconds']:.2f} s in {sim['steps']:,} steps, "
        f"{sim['cpu_seconds']:.2f} CPU s ({sim['output_tokens_per_cpu_second']:,.0f} output tok/CPU s)"
    )


def run(args: argparse.Namespace) -> int:
    from inference_lab.engine.drivers.offline import run_offline
    from inference_lab.common.workload import load_workload

    deployment = pick_deployment(args)
    if args.max_num_seqs is not None:
        from inference_lab.engine.sim.core import CapacityError, EngineCore

        try:  # validate exactly as a live SetCapacity would
            EngineCore(deployment).check_capacity(max_num_seqs=args.max_num_seqs)
        except CapacityError as exc:
            raise UsageError(str(exc)) from None
        deployment.scheduler = dataclasses.replace(deployment.scheduler,
                                                   max_num_seqs=args.max_num_seqs)
    spec = load_workload(args.workload)
    tokenizer = None
    if args.tokenizer is not None:
        from inference_lab.common.tokenizer import TokenizerError, load_tokenizer

        try:
            tokenizer = load_tokenizer(args.tokenizer)
        except TokenizerError as exc:
            raise UsageError(f"--tokenizer: {exc}") from None

    layout = pd_layout(args, deployment)
    size = args.data_parallel_size
    if size < 1:
        raise UsageError(f"--data-parallel-size: must be at least 1, got {size}")
    if size > 1 and layout is not None:
        raise UsageError("--data-parallel-size: not with a disaggregated deployment "
                         "(--pd or the config's [pd])")
    show = (not args.no_progress and sys.stderr.isatty()
            and spec.num_requests is not None and spec.num_requests >= 2000)
    simulate = run_offline
    if layout is not None:
        from inference_lab.engine.drivers.disagg import PdError, run_disaggregated

        def simulate(*a, **kw):
            try:
                return run_disaggregated(*a[:2], layout, **kw)
            except PdError as exc:
                raise UsageError(f"--pd: {args.workload}: {exc}") from None
    elif size > 1:
        from inference_lab.engine.drivers.data_parallel import run_data_parallel

        def simulate(*a, **kw):
            return run_data_parallel(*a[:2], size, **kw)
    if show:
        from rich.progress import Progress

        with Progress(transient=True) as progress:
            task = progress.add_task("simulating", total=spec.num_requests)
            summary = simulate(deployment, spec, seed=args.seed, tokenizer=tokenizer,
                               on_progress=lambda done, total: progress.update(task, completed=done))
    else:
        summary = simulate(deployment, spec, seed=args.seed, tokenizer=tokenizer)
    print_table(summary)
    if "pd" in summary:
        print_pools(summary)
    if "data_parallel" in summary:
        print_ranks(summary)
    if args.output:
        args.output.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"wrote {args.output}")
    return 0
