"""`inference-lab gateway`: the OpenAI-compatible HTTP gateway alone, in front of an engine.

Knows: the subcommand's flags and how to run `gateway.run.run_gateway` (on asyncio's
loop, or uvloop with `--event-loop uvloop`) until Ctrl-C or SIGTERM.

Does not know: anything about HTTP routes or the engine protocol (package `gateway`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from pathlib import Path

from inference_lab.cli.flag_types import number, port, refused_as, seconds
from inference_lab.cli.engine_profile_flags import ENGINES, saturated_status
from inference_lab.cli.auth_flags import (
    add_api_key_argument,
    add_control_token_argument,
    api_key,
    control_token,
    warn_exposure,
)
from inference_lab.cli.cmd_engine import LENGTH_FLAGS
from inference_lab.common import lifeline

log = logging.getLogger("inference_lab.gateway")

DEFAULT_ENGINE = "127.0.0.1:50051"
FAULTS_STATE_FILE = "faults.json"
DEV_MODE_VARIABLE = "VLLM_SERVER_DEV_MODE"  # vLLM's switch of its dev-mode routes


def _engine_addresses(text: str) -> list[str]:
    """--engine: one address, or several (comma-separated) engine processes that share
    one fleet (`serve --engine-processes`, or data-parallel ranks)."""
    return [_engine_address(part.strip()) for part in text.split(",")]


def _engine_address(text: str) -> str:
    """One engine: HOST:PORT (or a gRPC target with a scheme: unix:, dns:, ipv4:, ipv6:),
    checked while the flags are read, so a typo is not a gateway that answers only 503s."""
    if text.startswith(("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:")):
        return text
    host, sep, tail = text.rpartition(":")
    if not sep or not host or not tail.isdigit() or not 1 <= int(tail) <= 65535:
        raise argparse.ArgumentTypeError(
            f"expected HOST:PORT with a port in 1..65535 (or a gRPC target such as "
            f"unix:/path), got {text!r}")
    return text


def _tokenizer(path: str):
    """--tokenizer: loaded while the flags are read, so a bad file stops the start-up."""
    from inference_lab.common.tokenizer import TokenizerError, load_tokenizer

    with refused_as(TokenizerError):
        return load_tokenizer(path)


def _backlog(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of connections, got {text!r}")
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be from 1 to 65535, got {value}")
    return value


def add_gateway_arguments(parser: argparse.ArgumentParser, engine_flag: bool = True) -> None:
    """The gateway's flags: shared by `gateway` and `serve` (which starts its own engine)."""
    if engine_flag:
        parser.add_argument(
            "--engine", default=[DEFAULT_ENGINE], metavar="HOST:PORT[,HOST:PORT...]",
            type=_engine_addresses,
            help="gRPC address of the engine (`inference-lab engine`); several, comma-"
            "separated, for engine processes that share one fleet: replica index i in the "
            "i mod n-th (`engine --replica-shard`), or rank S + k in the k-th with "
            "--data-parallel",
        )
        parser.add_argument(
            "--engine-profile", choices=ENGINES, default="vllm",
            help="the serving engine the engines imitate (their `--engine`): its refusal "
            "status and its routes (sglang: /get_server_info, /get_load, /v1/loads, "
            "/health_generate, /get_model_info, /flush_cache in SGLang's shapes)",
        )
        parser.add_argument(
            "--data-parallel", choices=("internal", "external"), default=None,
            help="the engines are the data-parallel ranks of one server (`engine "
            "--data-parallel-size D --data-parallel-rank R`, in rank order): internal = one "
            "port, each request on the rank X-data-parallel-rank names, else vLLM's balancer "
            "over the ranks' waiting and running counts; external = rank k on --port + k",
        )
        parser.add_argument(
            "--data-parallel-start-rank", type=number(int, lambda v: v >= 0, "an integer >= 0"),
            default=0, metavar="S", help="the rank of the first --engine (default 0)",
        )
        parser.add_argument(
            "--api-server-index", type=number(int, lambda v: v >= 0, "an integer >= 0"),
            default=0, metavar="I", help=argparse.SUPPRESS)
        parser.add_argument(
            "--api-server-count", type=number(int, lambda v: v >= 1, "an integer >= 1"),
            default=1, metavar="A",
            help="gateway processes sharing these ports (SO_REUSEPORT; the kernel spreads "
            "connections over them); this one is --api-server-index (default 1)",
        )
        parser.add_argument(
            "--config", type=Path, metavar="DIR",
            help="deployment configs (a directory of *.toml, or one file) whose [fault] tables "
            "set each model's injected errors, retry hints and static directive",
        )
    parser.add_argument(
        "--state-dir", type=Path, metavar="DIR",
        help="directory for live state that must survive a restart (written atomically after "
        "every change, restored and logged at start): the gateway's fault settings "
        "(faults.json); `serve` and `engine` keep live capacity there too (capacity.json)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on for HTTP")
    parser.add_argument("--port", type=port, default=8080, help="HTTP port to listen on")
    parser.add_argument(
        "--header-timeout", type=seconds, default=10.0, metavar="S",
        help="close a connection that has not sent a complete request header S seconds after "
        "connecting (or after the first byte of a later request), with a 408: half-sent "
        "headers cannot hold file descriptors (0 = no limit; default 10)",
    )
    parser.add_argument(
        "--backlog", type=_backlog, default=None, metavar="N",
        help="the listening socket's accept queue: connections the kernel completes while "
        "the gateway has not accepted them yet (vLLM's uvicorn uses 2048; beyond it a burst of "
        "new connections waits for SYN retries, a second or more). Capped by the kernel's "
        "net.core.somaxconn (default 2048)",
    )
    parser.add_argument(
        "--enable-directives", action="store_true",
        help="honour per-request fault directives (header `x-inference-lab-fault: "
        "<mode>[;after_chunks=N][;after_tokens=N][;delay_ms=N][;utf8=true]`) on streaming "
        "chat and completions; without it such a header is a 400 invalid_fault_directive",
    )
    parser.add_argument(
        "--tokenizer", metavar="PATH", type=_tokenizer, default=None,
        help="a Hugging Face tokenizer.json that turns prompts into token IDs (read with the "
        "`tokenizers` package; nothing is downloaded). Default: the built-in byte-level "
        "tokenizer, 4 UTF-8 bytes per token. usage.prompt_tokens and prefix caching follow it",
    )
    parser.add_argument(
        "--session-lane", choices=("auto", "off"), default=None,
        help="auto: carry the Session to an engine on this host over its plain-socket lane "
        "(SessionLane RPC; less CPU and latency per batch than the gRPC stream), else over "
        "gRPC; off: always gRPC (default: $INFERENCE_LAB_SESSION_LANE, else auto)",
    )
    parser.add_argument(
        "--event-loop", choices=("asyncio", "uvloop"), default="asyncio",
        help="the gateway's event loop. asyncio (default): a request's arrival is the "
        "instant its bytes reached this host (the kernel's receive timestamp, Linux), so a "
        "busy gateway's delay in reading it is not booked as modelled queueing; uvloop: "
        "reads in C, so an arrival is stamped when the gateway reads it (later, on a busy "
        "gateway), for about the same gateway CPU (docs/benchmarks.md, 'TTFT breakdown')",
    )
    parser.add_argument(
        "--saturated-status", type=int, choices=(529, 503, 429), default=None,
        help="the status a saturated model's refusal carries, before any byte of a response: "
        "529 overloaded_error (default; 503 with --engine sglang, as SGLang answers), or "
        "503 / 429 as other servers and simulators answer; "
        "the code stays queue_saturated, the envelope the route's (docs/routers.md)",
    )
    parser.add_argument(
        "--saturated-retry-after", type=number(int, lambda v: 0 <= v <= 86_400,
                                               "whole seconds in 0..86400"),
        default=None, metavar="S",
        help="add `Retry-After: S` to every refusal of a saturated model (default: none)",
    )
    parser.add_argument(
        "--no-served-by-headers", dest="served_by", action="store_false",
        help="generation responses do not name the replica and model that answered them "
        "(x-inference-lab-replica, x-inference-lab-model): the headers vLLM sends and no other",
    )
    parser.add_argument(
        "--dev-mode", action="store_true",
        help="serve vLLM's dev-mode routes: /pause, /resume, /is_paused, /reset_prefix_cache "
        f"(control routes, like /control/*); also on with {DEV_MODE_VARIABLE}=1, vLLM's own "
        "switch (default: off, and those routes are 404s, as in vLLM; docs/endpoints.md)",
    )
    parser.add_argument(
        "--no-dashboard", dest="dashboard", action="store_false",
        help="do not serve the live dashboard (GET /dashboard, its feed /dashboard/feed, and "
        "/ redirecting to it) on the API port (docs/dashboard.md)",
    )
    add_api_key_argument(parser)
    add_control_token_argument(
        parser, "/control/* as `Authorization: Bearer TOKEN`, and send it to the engine "
        "with SetCapacity")


def fault_kwargs(config: Path | None, state_dir: Path | None) -> dict:
    """create_app's fault arguments: the [fault] tables of `config`, overridden by the
    state saved in `state_dir` (logged), and the callback that saves it there."""
    from inference_lab.common.state_file import StateFileError, read_state, write_state
    from inference_lab.gateway.faults.config import load_fault_tables
    from inference_lab.gateway.faults.injection import FaultState
    from inference_lab.gateway.faults.saving import FaultSaver
    from inference_lab.cli import UsageError

    settings, static = load_fault_tables(config) if config is not None else ({}, {})
    state = FaultState(models=settings)
    save = None
    if state_dir is not None:
        path = state_dir / FAULTS_STATE_FILE
        try:
            saved = read_state(path)
            if saved is not None:
                state = FaultState.restore(saved)
        except (StateFileError, KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"--state-dir: {path}: cannot restore the fault settings: {exc}")
        if saved is not None:
            log.info("restored live fault settings from %s: %s", path, state.snapshot())

        def write(snapshot: dict) -> None:  # (in a worker thread: gateway.faults.saving)
            try:
                write_state(path, snapshot)
            except OSError as exc:
                log.error("cannot save the fault settings to %s: %s", path, exc)

        save = FaultSaver(write)
    return {"faults": state, "save_faults": save, "static_faults": static}


def dev_mode(args: argparse.Namespace) -> bool:
    """--dev-mode, or vLLM's switch: VLLM_SERVER_DEV_MODE set to an integer other than 0
    (vLLM reads it as `bool(int(...))`; anything else is a usage error here)."""
    from inference_lab.cli import UsageError

    if getattr(args, "dev_mode", False):
        return True
    text = os.environ.get(DEV_MODE_VARIABLE, "").strip()
    if not text:
        return False
    try:
        return bool(int(text))
    except ValueError:
        raise UsageError(f"{DEV_MODE_VARIABLE}={text[:40]!r}: expected 0 or 1") from None


def gateway_app_kwargs(args: argparse.Namespace, config: Path | None = None) -> dict:
    """create_app keyword arguments from the parsed gateway flags (secrets from the
    environment when their flags are absent)."""
    from inference_lab.gateway.errors import Saturation

    kwargs = {"api_key": api_key(args), "control_token": control_token(args),
              "enable_directives": args.enable_directives,
              "tokenizer": args.tokenizer, "session_lane": args.session_lane,
              "saturation": Saturation(saturated_status(args), args.saturated_retry_after),
              "engine_profile": getattr(args, "engine_profile", "vllm"),
              "served_by": args.served_by, "dev_mode": dev_mode(args),
              "dashboard_page": args.dashboard,
              **fault_kwargs(config if config is not None else getattr(args, "config", None),
                             args.state_dir)}
    _log_exposure(args.host, kwargs["api_key"], kwargs["control_token"])
    return kwargs


def _log_exposure(host: str, key: str | None, token: str | None) -> None:
    if key:
        log.info("/v1/* requires the API key")
    if token:
        log.info("/control/* requires the control token")
    missing = [flag for flag, value in (("--api-key", key), ("--control-token", token)) if not value]
    warn_exposure(log, host, "the gateway", missing)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "gateway",
        help="run the OpenAI-compatible HTTP gateway in front of a running engine",
        description=(
            "Serve the OpenAI-compatible API (/v1/chat/completions, /v1/completions, "
            "/v1/models), /health, /metrics and /control/capacity over HTTP, forwarding every "
            "request to an inference-lab engine over gRPC (one multiplexed Session stream). "
            "A full waiting queue is answered with HTTP 529 before any response starts; an "
            "unreachable engine with 503. The gateway reconnects by itself when the engine "
            "comes back."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_gateway_arguments(parser)
    for flag in LENGTH_FLAGS:  # moved to the engine, which now chooses output lengths
        parser.add_argument(flag, dest=f"moved_{flag[2:].replace('-', '_')}",
                            default=None, help=argparse.SUPPRESS)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from inference_lab.gateway.run import run_gateway
    from inference_lab.cli import UsageError

    for flag in LENGTH_FLAGS:
        if getattr(args, f"moved_{flag[2:].replace('-', '_')}") is not None:
            raise UsageError(f"{flag} is a flag of the engine now, which chooses the length of a "
                             f"request without max_tokens: `inference-lab engine {flag} ...` "
                             "(`serve` takes it too)")

    async def main() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        assert task is not None
        def stop() -> None:
            # An orphan (its parent, a lab process, is gone) still closes its listeners,
            # but gets a deadline: open streams are nobody's to wait for.
            lifeline.shutdown_grace(0.0)
            task.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop)
            except (NotImplementedError, RuntimeError):  # not on this platform
                pass
        try:
            await run_gateway(args.engine, host=args.host, port=args.port,
                              header_timeout=args.header_timeout, backlog=args.backlog,
                              on_ready=lambda bound: print(
                                  f"serving on http://{args.host}:{bound}", flush=True),
                              **fleet_kwargs(args), **gateway_app_kwargs(args))
        except asyncio.CancelledError:
            pass

    loop_runner(args)(main())
    return 0


def fleet_kwargs(args: argparse.Namespace, engines: int | None = None) -> dict:
    """run_gateway's fleet arguments from the flags: which engine holds which ranks, the
    data-parallel mode, this API server's place among those sharing the ports."""
    from inference_lab.cli import UsageError

    count = engines if engines is not None else len(args.engine)
    if args.api_server_index >= args.api_server_count:
        raise UsageError(f"--api-server-index must be below --api-server-count "
                         f"({args.api_server_count}), got {args.api_server_index}")
    out: dict = {"api_server": (args.api_server_index, args.api_server_count)}
    if args.data_parallel is not None:
        start = args.data_parallel_start_rank
        out.update(owners=[[start + k] for k in range(count)], data_parallel=True,
                   balance=args.data_parallel == "internal",
                   replica_ports=args.data_parallel == "external")
    return out


def loop_runner(args: argparse.Namespace):
    """asyncio.run, or uvloop.run for `--event-loop uvloop` (a usage error without it)."""
    if args.event_loop == "asyncio":
        return asyncio.run
    try:
        import uvloop
    except ImportError:
        from inference_lab.cli import UsageError
        raise UsageError("--event-loop uvloop: the uvloop package is not installed") from None
    return uvloop.run
