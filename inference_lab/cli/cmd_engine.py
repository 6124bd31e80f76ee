"""`inference-lab engine`: the engine service alone (gRPC + Prometheus metrics).

On SIGTERM / Ctrl-C it drains for --grace; started by `serve` and orphaned (its lifeline's
SIGTERM: common.lifeline) it stops without a grace period, and removes a state directory
`serve` made for the run (--state-dir-temporary), since nobody else is left to.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import shutil
import signal
import sys
from pathlib import Path

from inference_lab.cli.auth_flags import (add_api_key_argument, add_control_token_argument,
                                          api_key, control_token, warn_exposure)
from inference_lab.cli.flag_types import (number, port, positive_int, rate, refused_as, seconds,
                                          share, time_scale, update_rate)
from inference_lab.cli.engine_profile_flags import add_engine_profile_arguments
from inference_lab.cli.offload_flags import add_offload_arguments, flagged
from inference_lab.cli.catalog_flags import (
    add_catalog_argument, add_kv_cache_dtype_argument, add_timing_argument, build_catalog,
)
from inference_lab.common import lifeline

log = logging.getLogger("inference_lab.engine")

HELP = """\
Run the simulated engine as a gRPC service (inference_lab.v1.Engine: Submit, Session,
GetCapacity, SetCapacity, ListModels; plus gRPC health and reflection) with Prometheus
metrics. Point `inference-lab gateway --engine HOST:PORT` at it, or use grpcurl:

  grpcurl -plaintext 127.0.0.1:50051 list
  grpcurl -plaintext -d '{}' 127.0.0.1:50051 inference_lab.v1.Engine/GetCapacity
"""


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that choose what is served: shared by `engine` and `serve`."""
    p.add_argument("--config", type=Path,
                   help="directory of deployment configs (or one file); default: the embedded "
                        "gpt-oss-20b deployment")
    p.add_argument("--hardware", default="b200", help="hardware preset to simulate (default b200)")
    p.add_argument("--max-waiting", type=int, metavar="N",
                   help="refuse arrivals once N requests wait, for every model (0 = unbounded)")
    add_catalog_argument(p)
    add_timing_argument(p)
    add_kv_cache_dtype_argument(p)
    add_engine_profile_arguments(p)
    add_offload_arguments(p)
    p.add_argument("--enable-lora", action="store_true",
                   help="serve LoRA adapters (loaded at start with --lora-modules, or at run "
                        "time with POST /v1/load_lora_adapter); implied by --lora-modules")
    p.add_argument("--lora-modules", nargs="+", action="extend", type=_lora_module,
                   metavar="NAME=PATH",
                   help="LoRA adapters to serve, as vLLM takes them: name=path, or JSON "
                        '{"name": ..., "path": ..., "base_model_name": ...}; a request names '
                        "the adapter in `model`; PATH/adapter_config.json gives the rank r "
                        "(else 16)")
    p.add_argument("--max-loras", type=positive_int, metavar="N",
                   help="at most N distinct adapters in one batch, and N resident on the GPU "
                        "(vLLM's flag; default 1); requests of another adapter wait")
    p.add_argument("--kv-events-config", type=_kv_events_config, metavar="JSON",
                   help="publish KV-cache events over ZMQ in vLLM's wire format, configured as "
                        "vLLM's flag is: e.g. '{\"enable_kv_cache_events\": true, \"endpoint\": "
                        "\"tcp://127.0.0.1:5557\", \"replay_endpoint\": \"tcp://127.0.0.1:5558\", "
                        "\"topic\": \"kv@{model}\"}'; replica k publishes on the ports + k, or + 2dk "
                        "when the two are d < 64 apart, so that no two replicas' ports meet "
                        "(docs/kv-events.md)")
    p.add_argument("--kv-cache-metrics", action="store_true",
                   help="export vLLM's KV block residency histograms (vllm:kv_block_lifetime_seconds, "
                        "_idle_before_evict_seconds, _reuse_gap_seconds) of a sample of the "
                        "prefix-cached blocks, in simulated seconds (docs/metrics.md)")
    p.add_argument("--kv-cache-metrics-sample", type=rate, default=0.01, metavar="RATE",
                   help="share of blocks --kv-cache-metrics follows, in (0, 1] (vLLM's default 0.01)")
    p.add_argument("--enable-mfu-metrics", action="store_true",
                   help="export vLLM's MFU estimates (vllm:estimated_flops_per_gpu_total, "
                        "_read_bytes_per_gpu_total, _write_bytes_per_gpu_total): each step's "
                        "FLOPs and bytes per GPU by the cost model (docs/metrics.md)")
    p.add_argument("--kv-events-expose-replay", action="store_true",
                   help="bind the KV events' replay_endpoint on the host it names; without it "
                        "the replay socket binds 127.0.0.1 (same port), since a replay hands "
                        "any caller the recent prompts' token IDs (docs/security.md)")


def _lora_module(text: str) -> str:
    from inference_lab.engine.service.lora_modules import parse_lora_module
    from inference_lab.engine.sim.lora import LoraError

    with refused_as(LoraError):
        parse_lora_module(text)
    return text


def lora_argv(args: argparse.Namespace) -> list[str]:
    """The LoRA flags again, for `serve` to hand to its engine child."""
    argv = ["--enable-lora"] if args.enable_lora else []
    if args.lora_modules:
        argv += ["--lora-modules", *args.lora_modules]
    if args.max_loras is not None:
        argv += ["--max-loras", str(args.max_loras)]
    return argv


def _kv_events_config(text: str) -> str:
    """Checked while the flags are read (a bad value stops the start-up); kept as text so
    that `serve` can hand it to its engine child."""
    from inference_lab.engine.service.kv_events import (KVEventsConfig, KVEventsConfigError,
                                                         require_zmq)

    with refused_as(KVEventsConfigError):
        config = KVEventsConfig.parse(text)
    if config.enabled:
        require_zmq()  # MissingExtra: one line naming the extra, before anything starts
    return text


def _startup_delay(text: str) -> float | str:
    from inference_lab.engine.fleet.startup import parse_startup_delay

    with refused_as(ValueError):
        return parse_startup_delay(text)


def _replicas(text: str) -> int:
    from inference_lab.engine.fleet.replicas import MAX_REPLICAS

    return number(int, lambda v: 1 <= v <= MAX_REPLICAS, f"an integer in 1..{MAX_REPLICAS}")(text)


def add_fleet_arguments(p: argparse.ArgumentParser) -> None:
    """The replica flags: shared by `engine` and `serve`."""
    p.add_argument("--replicas", type=_replicas, default=1, metavar="N",
                   help="independent replicas of every model, each its own modelled GPU, "
                        "scheduler, KV cache and queue (default 1; at most 64); `serve` answers "
                        "replica i on --port + i")
    p.add_argument("--data-parallel-size", type=_replicas, default=1, metavar="D",
                   help="vLLM's data parallelism: D ranks of every model, each its own modelled "
                        "GPU group, scheduler, KV cache and queue, serving as one server (their "
                        "KV events and server info say their rank; `serve` balances requests "
                        "over them on one port, as vLLM's API server does). Default 1")
    p.add_argument("--startup-delay", type=_startup_delay, default=0.0, metavar="SECONDS|auto",
                   help="a replica is ready this long after it is created (default 0); auto = "
                        "resident weight bytes / the hardware preset's load_bandwidth / tp, plus "
                        "20 s of fixed engine start-up")
    p.add_argument("--kv-roles", metavar="P:D|ROLE,...", default=None,
                   help="prefill/decode disaggregation (vLLM's kv_role per replica): P:D = the "
                        "first P replicas kv_producer (prefill), the next D kv_consumer "
                        "(decode), P + D = --replicas; or one role per replica, comma-separated "
                        "(kv_producer, kv_consumer, kv_both; or prefill, decode, both). "
                        "Default: no KV connector (kv_transfer_params are ignored, as vLLM "
                        "ignores them without --kv-transfer-config)")
    p.add_argument("--kv-link", type=_kv_link, default="rdma", metavar="nvlink|rdma|GBPS[@MS]",
                   help="the link a decode replica pulls KV over: nvlink (within a node: the "
                        "hardware preset's scale-up fabric), rdma (across nodes: its scale-out "
                        "NIC per GPU; the default) or a bandwidth in GB/s with an optional "
                        "setup latency in ms, e.g. 25@0.05")
    p.add_argument("--kv-abort-timeout", type=seconds, default=480.0, metavar="SECONDS",
                   help="how long a prefill replica holds KV nobody pulls before freeing it "
                        "(vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT; default 480)")
    p.add_argument("--kv-hold-share", type=share, default=0.5, metavar="SHARE",
                   help="of a replica's KV cache, the share its P/D handoffs may hold, those of "
                        "admitted prefills included; a prefill past it is refused (503 "
                        "kv_transfer_full). 0 < SHARE <= 1; default 0.5")


def _ports(text: str) -> list[int]:
    try:
        ports = [int(part) for part in text.split(",")]
    except ValueError:
        ports = []
    if not ports or not all(1 <= p <= 65535 for p in ports):
        raise argparse.ArgumentTypeError(f"expected ports in 1..65535, comma-separated, got {text!r}")
    return ports


def _shard(text: str):
    from inference_lab.engine.fleet.replicas import Shard

    part, sep, of = text.partition("/")
    try:
        return Shard(int(part), int(of))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected p/P with 0 <= p < P (this process holds replica indices i with "
            f"i mod P = p), got {text!r}") from None


def lockstep_ports(args: argparse.Namespace, ranks: int) -> list[int] | None:
    """--data-parallel-lockstep-ports, checked against the ranks (a UsageError)."""
    from inference_lab.cli import UsageError

    ports = args.data_parallel_lockstep_ports
    if ports is None:
        return None
    if args.data_parallel_rank is None or len(ports) != ranks:
        raise UsageError(f"--data-parallel-lockstep-ports: one port per rank of "
                         f"--data-parallel-size {ranks}, with --data-parallel-rank")
    return ports


def refuse_replicas_beside_ranks(args: argparse.Namespace) -> None:
    """A UsageError for the fleet flags that do not go with data-parallel ranks (the ranks
    of one server are not independent servers): `engine` and `serve` alike."""
    from inference_lab.cli import UsageError

    if args.replicas != 1:
        raise UsageError("--replicas and --data-parallel-size: choose one (independent "
                         "servers, or the data-parallel ranks of one)")
    if args.kv_roles:
        raise UsageError("--kv-roles needs --replicas: prefill and decode replicas are "
                         "independent servers, not data-parallel ranks")


def fleet_layout(args: argparse.Namespace):
    """(the fleet's replica count, this process's Shard, data-parallel or not) from the
    engine's fleet flags; a UsageError where they contradict each other."""
    from inference_lab.cli import UsageError
    from inference_lab.engine.fleet.replicas import Shard

    dp = args.data_parallel_size
    rank = getattr(args, "data_parallel_rank", None)
    shard = getattr(args, "replica_shard", None)
    if dp > 1 or rank is not None:
        refuse_replicas_beside_ranks(args)
        if rank is not None and not 0 <= rank < dp:
            raise UsageError(f"--data-parallel-rank must be in 0..{dp - 1} "
                             f"(--data-parallel-size {dp}), got {rank}")
        return dp, (Shard(rank, dp) if rank is not None else Shard()), True
    return args.replicas, shard or Shard(), False


def _kv_link(text: str) -> str:
    from inference_lab.engine.sim.catalog import load_hardware
    from inference_lab.engine.sim.kv_transfer import link_preset

    with refused_as(ValueError):
        link_preset(text, load_hardware("b200"))
    return text


def kv_roles(args: argparse.Namespace) -> tuple[str, ...]:
    """Each replica's kv_role from --kv-roles (UsageError when the layout is wrong)."""
    from inference_lab.cli import UsageError
    from inference_lab.engine.sim.kv_transfer import parse_roles

    if not args.kv_roles:
        return ()
    try:
        return parse_roles(args.kv_roles, args.replicas)
    except ValueError as exc:
        raise UsageError(f"--kv-roles: {exc}") from None


LENGTH_FLAGS = ("--workload", "--seed", "--default-max-tokens")


def add_length_arguments(p: argparse.ArgumentParser) -> None:
    """How long a request without max_tokens is: shared by `engine` and `serve`."""
    from inference_lab.engine.sim.lengths import DEFAULT_MAX_TOKENS

    p.add_argument("--workload", metavar="FILE", default=None,
                   help="workload TOML whose output-length distribution sets how many tokens a "
                        "request without max_tokens generates (capped by max_tokens when given)")
    p.add_argument("--seed", type=int, default=0, help="seed of the output-length draws from --workload")
    p.add_argument("--default-max-tokens", type=positive_int, default=DEFAULT_MAX_TOKENS, metavar="N",
                   help="tokens generated when a request gives no max_tokens and there is no "
                        f"--workload (default {DEFAULT_MAX_TOKENS})")


def output_lengths(args: argparse.Namespace):
    """The engine's OutputLength from the flags of add_length_arguments."""
    from inference_lab.cli import UsageError
    from inference_lab.common.toml import ConfigError
    from inference_lab.common.workload import output_length_sampler
    from inference_lab.engine.sim.lengths import OutputLength

    if args.workload is None:
        return OutputLength(args.default_max_tokens)
    if not Path(args.workload).is_file():
        raise UsageError(f"--workload: no such file: {args.workload}")
    try:
        return OutputLength(args.default_max_tokens, output_length_sampler(args.workload, args.seed))
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def add_pacing_arguments(p: argparse.ArgumentParser) -> None:
    from inference_lab.engine.service.server import DEFAULT_UPDATE_RATE

    p.add_argument("--max-update-rate", type=update_rate, default=DEFAULT_UPDATE_RATE,
                   metavar="N",
                   help="force a cap of N mid-stream token updates per second per model: with S "
                        "streams each stream's tokens then go together every S/N s (at least 1 "
                        "ms; first and last tokens never wait). 0 (default) = no fixed cap: every "
                        "token is its own update at the end of its step, unless the engine runs "
                        "late (see --coalesce-when-late)")
    p.add_argument("--coalesce-when-late", action=argparse.BooleanOptionalAction, default=True,
                   help="with no fixed cap, group a running stream's tokens while the pacer "
                        "or the gateway runs late (the pacer's wake-up lag over 2 ms on "
                        "average, the gateway's read lag over 1 ms), as few as keep them on "
                        "time, counted in inference_lab_coalesced_updates_total and logged once; "
                        "--no-coalesce-when-late: every step's tokens always go at once "
                        "(default: on)")
    p.add_argument("--time-scale", type=time_scale, default=1.0, metavar="K",
                   help="run the modelled clock K times faster than the wall clock (step times "
                        "scaled by 1/K on the wall; reported times stay modelled). The CPU "
                        "bounds K: see docs/experiments.md, 'Faster than real time' (default 1)")


def add_session_lane_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--session-lane", choices=("auto", "off"), default="auto",
                   help="auto (default): also serve the gateway's Session over a plain socket "
                        "on 127.0.0.1 (an ephemeral port, handed out by the SessionLane RPC "
                        "with a per-process token), which a gateway on this host uses instead "
                        "of the gRPC stream (less CPU and latency per batch); off: the Session "
                        "over gRPC only")


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """How the engine runs (replicas, pacing, output lengths, the shutdown grace): the
    same flags on `engine` and `serve` (which passes them to its engine child)."""
    add_fleet_arguments(p)
    add_pacing_arguments(p)
    add_length_arguments(p)
    p.add_argument("--grace", type=seconds, default=10.0,
                   help="seconds in-flight requests get to finish on SIGTERM or shutdown "
                        "(default 10)")
    p.add_argument("--enable-sleep-mode", action="store_true",
                   help="vLLM's sleep mode: POST /sleep?level=1|2 and /wake_up put replicas to "
                        "sleep (requests refused, KV and weights freed) and wake them (the "
                        "weights' modelled reload delays the first steps); GET /is_sleeping")
    p.add_argument("--reasoning", action="store_true",
                   help="reasoning models (a preset with [reasoning]: gpt-oss, DeepSeek-R1) open "
                        "each reply with reasoning, their preset's share of it, as vLLM's "
                        "reasoning parsers separate it (reasoning_content, reasoning items, "
                        "thinking blocks); without it only a request that asks (reasoning_effort, "
                        "reasoning.effort, thinking) gets reasoning")


def load_deployments(args: argparse.Namespace):
    from inference_lab.engine.sim.config import default_deployments, load_config_dir

    catalog = build_catalog(args)
    if args.config is None:
        return flagged(args, default_deployments(args.hardware, args.max_waiting, catalog,
                                                 args.timing, args.kv_cache_dtype))
    deployments = flagged(args, load_config_dir(args.config, args.hardware, args.max_waiting,
                                                catalog, args.timing, args.kv_cache_dtype))
    for dep in deployments:
        if dep.pd is not None:  # (the sim's layout: a served one is set by flags)
            log.warning("%s: [pd] is read by `inference-lab sim` only; serve P/D with "
                        "--replicas %d --kv-roles %d:%d --kv-link %s", dep.source,
                        dep.pd.prefill + dep.pd.decode, dep.pd.prefill, dep.pd.decode, dep.pd.link)
    return deployments


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("engine", help="run the engine gRPC service", description=HELP,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=50051, help="gRPC port (default 50051; 0 = any free)")
    from inference_lab.engine.service.server import DEFAULT_METRICS_PORT

    p.add_argument("--metrics-port", type=port, default=DEFAULT_METRICS_PORT,
                   help=f"Prometheus /metrics port (default {DEFAULT_METRICS_PORT}, beside the gRPC "
                        "port and outside the exporters' 9100-9999; 0 = any free). A gateway "
                        "serves the same series on its API port's /metrics")
    add_run_arguments(p)
    add_session_lane_argument(p)
    p.add_argument("--state-dir", type=Path, metavar="DIR",
                   help="keep live capacity (SetCapacity) in DIR/capacity.json, written "
                        "atomically after every change, restored and logged at start, so it "
                        "survives a restart")
    p.add_argument("--data-parallel-rank", type=int, default=None, metavar="R",
                   help="run rank R of --data-parallel-size alone in this process (vLLM's one "
                        "engine core per rank): replica index R, its KV events on the "
                        "endpoints' ports + R")
    p.add_argument("--data-parallel-lockstep-ports", type=_ports, default=None,
                   metavar="PORT,PORT,...",
                   help="with --data-parallel-rank: every rank's UDP port on 127.0.0.1, in rank "
                        "order (`serve` sets it): an MoE model's ranks step in lockstep, each "
                        "step as long as the slowest rank's, an idle rank in a dummy pass")
    p.add_argument("--replica-shard", type=_shard, default=None, metavar="p/P",
                   help="hold only the replica indices i with i mod P = p of a fleet spread "
                        "over P engine processes (`serve --engine-processes` sets it); "
                        "--replicas stays the fleet's count")
    p.add_argument("--state-dir-temporary", action="store_true",
                   help="--state-dir is a directory the parent made for its run (as `serve` "
                        "does): removed at exit when the parent is gone")
    add_api_key_argument(p, "Submit, Session and SessionLane, as gRPC metadata `authorization: "
                            "Bearer KEY` (the control token passes too)")
    add_control_token_argument(p, "SetCapacity, SetReplicas, InjectFault and the LoRA calls, "
                                  "as gRPC metadata `authorization: Bearer TOKEN`")
    p.set_defaults(func=run)


async def run_until_signal(server, grace: float) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    # Start-up objects live as long as the process: out of the collector's full passes;
    # young-generation passes less often (they show up as pacing lag).
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 100)
    sys.setswitchinterval(0.0005)  # grpc.aio's poller thread should not wait 5 ms for the GIL
    print(f"engine ready: grpc {server.host}:{server.port} metrics {server.metrics_port}", flush=True)
    await stop.wait()
    grace = lifeline.shutdown_grace(grace)  # 0 when the parent is gone
    log.info("stopping: draining in-flight requests for up to %.1f s", grace)
    await server.stop(grace)


def check_ports(args: argparse.Namespace, named: list[tuple[str, int]]) -> None:
    """Refuse (a UsageError naming them) fixed ports that clash, before anything binds:
    `named` and every replica's KV event ports (--kv-events-config)."""
    from inference_lab.cli import UsageError
    from inference_lab.common.ports import port_clashes
    from inference_lab.engine.service.kv_events import KVEventsConfig, bound_ports

    if args.kv_events_config:
        replicas = max(args.replicas, getattr(args, "data_parallel_size", 1))
        named = named + bound_ports(KVEventsConfig.parse(args.kv_events_config), replicas)
    problems = port_clashes(named)
    if problems:
        raise UsageError("the ports clash, nothing was started: " + "; ".join(problems))


def run(args: argparse.Namespace) -> int:
    from inference_lab.engine.service.server import EngineServer

    check_ports(args, [(what, p) for what, p in (("the engine's gRPC port", args.port),
                                                  ("the metrics port", args.metrics_port)) if p])
    replicas, shard, data_parallel = fleet_layout(args)
    deployments = load_deployments(args)
    lengths = output_lengths(args)
    token, key = control_token(args), api_key(args)
    from inference_lab.engine.service.kv_events import KVEventsConfig
    from inference_lab.engine.service.lora_modules import parse_lora_module

    kv_events = KVEventsConfig.parse(args.kv_events_config) if args.kv_events_config else None
    server = EngineServer(deployments, args.host, args.port, args.metrics_port, control_token=token,
                          api_key=key,
                          update_rate=args.max_update_rate, time_scale=args.time_scale,
                          coalesce_when_late=args.coalesce_when_late,
                          state_dir=args.state_dir, kv_events=kv_events,
                          kv_events_expose_replay=args.kv_events_expose_replay,
                          kv_cache_metrics_sample=(args.kv_cache_metrics_sample
                                                   if args.kv_cache_metrics else 0.0),
                          mfu_metrics=args.enable_mfu_metrics,
                          lora_modules=[parse_lora_module(m) for m in args.lora_modules or ()],
                          max_loras=(args.max_loras or 1) if (args.enable_lora or args.lora_modules
                                                              or args.max_loras) else 0,
                          replicas=replicas, shard=shard, data_parallel=data_parallel,
                          lockstep_ports=lockstep_ports(args, replicas),
                          startup_delay=args.startup_delay,
                          lengths=lengths, session_lane=args.session_lane,
                          sleep_mode=args.enable_sleep_mode, reasoning=args.reasoning,
                          kv_roles=kv_roles(args), kv_link=args.kv_link,
                          kv_abort_timeout=args.kv_abort_timeout,
                          kv_hold_share=args.kv_hold_share)
    if token:
        log.info("the control calls require the control token")
    if key or token:
        log.info("Submit, Session and SessionLane require the API key or the control token")
    warn_exposure(log, args.host, "the engine",
                  [] if key or token else ["--api-key", "--control-token"])
    from inference_lab.common.state_file import StateFileError
    from inference_lab.engine.sim.lora import LoraError

    try:
        try:  # uvloop: less CPU per pacer wake-up (BENCHMARKS.md, "Stream cadence")
            import uvloop
        except ImportError:
            asyncio.run(run_until_signal(server, args.grace))
        else:
            uvloop.run(run_until_signal(server, args.grace))
    except (OSError, StateFileError, LoraError) as exc:
        from inference_lab.cli import UsageError

        raise UsageError(str(exc)) from None
    finally:
        # While the parent lives it owns the directory (and restarts this engine on it).
        if args.state_dir_temporary and args.state_dir is not None and lifeline.orphaned():
            shutil.rmtree(args.state_dir, ignore_errors=True)
    return 0
