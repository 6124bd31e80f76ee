"""`inference-lab serve`: engine and gateway as one command (the embedded default).

Knows the process tree (cli.serve_layout): the engines run as child processes
(`inference-lab engine`, one per data-parallel rank or per share of the replicas, each its
own core for its pacers), the gateway in this process, or, with `--api-server-count A`
> 1, as A child processes (`inference-lab gateway`) sharing the HTTP ports. Validates the
configs before anything starts, restarts a child that dies (the gateway answers 503 for
an engine meanwhile and reconnects by itself), and on Ctrl-C / SIGTERM drains the
engines, then stops the gateways. Its children are bound to it (common.lifeline): if it
dies, even by SIGKILL, the engines stop without a grace period (one removes the temporary
state directory: it is told the directory is temporary) and so do the API servers; if its
own parent dies, it exits at once and leaves its children to that lifeline.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import tempfile

from inference_lab.cli.auth_flags import API_KEY_ENV, CONTROL_TOKEN_ENV, api_key, control_token
from inference_lab.cli.offload_flags import offload_argv
from inference_lab.cli.cmd_engine import (
    add_model_arguments, add_run_arguments, check_ports, kv_roles, load_deployments, lora_argv,
    output_lengths,
)
from inference_lab.cli.cmd_gateway import add_gateway_arguments, gateway_app_kwargs, loop_runner
from inference_lab.cli.engine_profile_flags import engine_profile_argv, saturated_status
from inference_lab.cli.flag_types import port
from inference_lab.cli.serve_layout import ServeLayout, add_scale_arguments, layout
from inference_lab.common import lifeline
from inference_lab.common.ports import free_port, free_port_run

log = logging.getLogger("inference_lab.serve")

HELP = """\
Serve the OpenAI-compatible API on a simulated GPU engine: the engine runs as a child
process, the gateway here. With no --config it serves the embedded gpt-oss-20b.

  inference-lab serve                                   # gpt-oss-20b on a B200 at :8080
  inference-lab serve --config configs/ --hardware b200 --max-waiting 64
  inference-lab serve --replicas 4 --startup-delay auto  # replica i on :8080 + i
  inference-lab serve --data-parallel-size 2 --api-server-count 2  # vLLM's scale-out shape

then: curl localhost:8080/control/capacity
"""
RESTART_DELAY_S = 1.0
READY_TIMEOUT_S = 60.0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="run engine and gateway together (start here)",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(p)
    add_gateway_arguments(p, engine_flag=False)
    p.add_argument("--engine-port", type=port, default=0,
                   help="engine gRPC port on 127.0.0.1 (default: any free port)")
    p.add_argument("--metrics-port", type=port, default=0,
                   help="the engine's own Prometheus /metrics port (default 0 = any free, "
                        "printed at start); the API port's /metrics serves the same vllm:* "
                        "series with the gateway's own")
    add_run_arguments(p)
    add_scale_arguments(p)
    p.set_defaults(func=run)


class Child:
    """A child process of `serve` (`argv`, `env`): started (ready once its first line of
    output starts with `ready`), watched, restarted when it dies, stopped on request.
    `label` starts the line that announces it; `down` says what answers while it is
    down."""

    label = "engine"  # ("engine started: pid N, ..." for every engine: tests read the pids)
    ready = b"engine ready"
    down = " (the gateway answers 503 for it meanwhile)"

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.proc: asyncio.subprocess.Process | None = None
        self.stopping = False

    async def start(self) -> None:
        # On the loop's thread, the main one: a child's lifeline fires when the thread that
        # forked it exits.
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
            env=self.env, start_new_session=True)  # Ctrl-C reaches us; we stop it in order
        try:
            async with asyncio.timeout(READY_TIMEOUT_S):
                line = await self.proc.stdout.readline()
        except TimeoutError:  # alive but not ready in time: give up on it
            line = b""
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        if not line.startswith(self.ready):
            code = await self.proc.wait()
            raise RuntimeError(f"the {self.name} did not start (exit status {code}); "
                               "see its log above")
        print(f"{self.label} started: pid {self.proc.pid}, {line.decode().strip()}",
              flush=True)
        asyncio.get_running_loop().create_task(self._drain_stdout(self.proc))

    @staticmethod
    async def _drain_stdout(proc: asyncio.subprocess.Process) -> None:
        while await proc.stdout.readline():
            pass

    async def supervise(self) -> None:
        """Restart the child whenever it exits without being asked to."""
        while not self.stopping:
            code = await self.proc.wait()
            if self.stopping:
                return
            log.error("%s exited with status %s; restarting in %.0f s%s", self.name, code,
                      RESTART_DELAY_S, self.down)
            await asyncio.sleep(RESTART_DELAY_S)
            try:
                await self.start()
            except RuntimeError as exc:
                log.error("%s", exc)

    async def stop(self, grace: float) -> None:
        self.stopping = True
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(grace + 5.0):
                await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


class EngineProcess(Child):
    """The engine child: one engine process of the layout (all of it, a data-parallel
    rank, or a share of the replicas)."""

    def __init__(self, args: argparse.Namespace, port: int, state_dir: str,
                 fleet: list[str] | None = None, metrics_port: int | None = None,
                 name: str = "engine", state_dir_temporary: bool = False) -> None:
        self.port = port
        metrics_port = args.metrics_port if metrics_port is None else metrics_port
        self.argv = [sys.executable, "-P", "-m", "inference_lab", "--log-level", args.log_level,
                     "engine", "--hardware", args.hardware, "--host", "127.0.0.1",
                     "--port", str(port), "--metrics-port", str(metrics_port),
                     "--grace", str(args.grace), "--max-update-rate", str(args.max_update_rate),
                     "--time-scale", repr(args.time_scale)]
        if not args.coalesce_when_late:
            self.argv.append("--no-coalesce-when-late")
        if args.enable_sleep_mode:
            self.argv.append("--enable-sleep-mode")
        if args.reasoning:
            self.argv.append("--reasoning")
        if args.session_lane == "off":  # (the gateway's flag: no lane on either side)
            self.argv += ["--session-lane", "off"]
        if args.config is not None:
            self.argv += ["--config", str(args.config)]
        # Live capacity survives the engine's restarts: it saves it there and restores it.
        self.argv += ["--state-dir", state_dir]
        if state_dir_temporary:  # the engine removes it if this process dies first
            self.argv.append("--state-dir-temporary")
        if args.max_waiting is not None:
            self.argv += ["--max-waiting", str(args.max_waiting)]
        self.argv += engine_profile_argv(args)
        if args.kv_events_config:
            self.argv += ["--kv-events-config", args.kv_events_config]
        if args.kv_events_expose_replay:
            self.argv.append("--kv-events-expose-replay")
        if args.kv_cache_metrics:
            self.argv += ["--kv-cache-metrics", "--kv-cache-metrics-sample",
                          repr(args.kv_cache_metrics_sample)]
        if args.enable_mfu_metrics:
            self.argv.append("--enable-mfu-metrics")
        self.argv += lora_argv(args)
        for directory in args.catalog:
            self.argv += ["--catalog", str(directory)]
        if args.timing is not None:
            self.argv += ["--timing", args.timing]
        if args.kv_cache_dtype is not None:
            self.argv += ["--kv-cache-dtype", args.kv_cache_dtype]
        self.argv += offload_argv(args)
        self.argv += ["--replicas", str(args.replicas)] if fleet is None else fleet
        if args.startup_delay:
            self.argv += ["--startup-delay", str(args.startup_delay)]
        if args.kv_roles:
            self.argv += ["--kv-roles", args.kv_roles]
        self.argv += ["--kv-link", args.kv_link, "--kv-abort-timeout", repr(args.kv_abort_timeout),
                      "--kv-hold-share", repr(args.kv_hold_share)]
        self.argv += ["--seed", str(args.seed), "--default-max-tokens", str(args.default_max_tokens)]
        if args.workload is not None:
            self.argv += ["--workload", os.path.abspath(args.workload)]
        # The engine requires the gateway's secrets too (engine.service.access): in the
        # environment (child_env), never argv.
        super().__init__(name, self.argv, child_env(args))

def child_env(args: argparse.Namespace) -> dict[str, str]:
    """A child's environment: the engine requires the gateway's secrets too
    (engine.service.access), passed through the environment, never argv (which any local
    user can list). A variable set outside but overridden by a flag, or unset, is not
    passed on."""
    secrets = {API_KEY_ENV: api_key(args), CONTROL_TOKEN_ENV: control_token(args)}
    return lifeline.child_env({**{k: v for k, v in os.environ.items() if k not in secrets},
                               **{k: v for k, v in secrets.items() if v}})


class GatewayProcess(Child):
    """One API server child (`inference-lab gateway`, `--api-server-count` > 1): started,
    watched, restarted when it dies, stopped on request, like an engine child."""

    ready = b"serving on "
    down = ""

    def __init__(self, args: argparse.Namespace, index: int, port: int, engines: list[int],
                 shape: ServeLayout, state_dir: str) -> None:
        self.port = port
        argv = [sys.executable, "-P", "-m", "inference_lab", "--log-level", args.log_level,
                "gateway", "--engine", ",".join(f"127.0.0.1:{p}" for p in engines),
                "--host", args.host, "--port", str(port),
                "--header-timeout", repr(args.header_timeout),
                "--api-server-index", str(index), "--api-server-count", str(shape.api_servers),
                "--event-loop", args.event_loop,
                "--saturated-status", str(saturated_status(args)),
                "--engine-profile", args.engine_profile]
        if shape.data_parallel is not None:
            argv += ["--data-parallel", shape.data_parallel,
                     "--data-parallel-start-rank", str(shape.start_rank)]
        if args.backlog is not None:
            argv += ["--backlog", str(args.backlog)]
        if args.enable_directives:
            argv.append("--enable-directives")
        if args.tokenizer is not None and getattr(args.tokenizer, "path", None):
            argv += ["--tokenizer", os.path.abspath(args.tokenizer.path)]
        if args.session_lane is not None:
            argv += ["--session-lane", args.session_lane]
        if args.saturated_retry_after is not None:
            argv += ["--saturated-retry-after", str(args.saturated_retry_after)]
        if not args.served_by:
            argv.append("--no-served-by-headers")
        if args.dev_mode:
            argv.append("--dev-mode")
        if not args.dashboard:
            argv.append("--no-dashboard")
        if args.config is not None:
            argv += ["--config", os.path.abspath(args.config)]
        # each API server keeps its own fault settings (gateway.faults): a file of its own
        argv += ["--state-dir", os.path.join(state_dir, f"api-server-{index}")]
        os.makedirs(argv[-1], exist_ok=True)
        super().__init__(f"API server {index}", argv, child_env(args))
        self.label = self.name


async def serve(args: argparse.Namespace, gateway_kwargs: dict) -> None:
    with contextlib.ExitStack() as stack:
        # Without --state-dir, live state still outlives an engine restart: a directory
        # for this run only.
        # (The engine removes it too when this process dies first: errors ignored here.)
        temporary = args.state_dir is None
        state_dir = str(args.state_dir) if not temporary else stack.enter_context(
            tempfile.TemporaryDirectory(prefix="inference-lab-state-", ignore_cleanup_errors=True))
        await _serve(args, gateway_kwargs, state_dir, temporary)


def _engines(args: argparse.Namespace, shape: ServeLayout, state_dir: str,
             state_dir_temporary: bool) -> list[EngineProcess]:
    """One child per engine process of the layout: the first on --engine-port (and
    --metrics-port), the others on free ports (and --metrics-port + k). The first removes
    a temporary state directory if this process dies first."""
    out = []
    # every rank here (not a share of them: ranks elsewhere are beyond this machine's reach)
    lockstep = ([str(free_port()) for _ in shape.engines]
                if shape.data_parallel and 1 < len(shape.engines) == args.data_parallel_size
                else [])
    for k, fleet in enumerate(shape.engines):
        if lockstep:  # an MoE model's ranks step together (engine.service.lockstep)
            fleet = [*fleet, "--data-parallel-lockstep-ports", ",".join(lockstep)]
        port = args.engine_port if (k == 0 and args.engine_port) else free_port()
        metrics = args.metrics_port + k if args.metrics_port else 0
        name = "engine" if len(shape.engines) == 1 else f"engine {k}"
        out.append(EngineProcess(args, port, state_dir, fleet, metrics, name,
                                 state_dir_temporary and k == 0))
    return out


async def _serve(args: argparse.Namespace, gateway_kwargs: dict, state_dir: str,
                 state_dir_temporary: bool) -> None:
    from inference_lab.gateway.run import run_gateway

    shape = layout(args)
    engines = _engines(args, shape, state_dir, state_dir_temporary)
    loop = asyncio.get_running_loop()
    children: list[Child] = []
    gateway: asyncio.Task | None = None
    try:
        for engine in engines:
            await engine.start()
            children.append(engine)
        if len(engines) > 1 or shape.api_servers > 1:
            log.info("serving %s", shape.describe())
        targets = [f"127.0.0.1:{e.port}" for e in engines]
        if shape.api_servers == 1:
            gateway = loop.create_task(run_gateway(
                targets if len(targets) > 1 else targets[0], host=args.host, port=args.port,
                header_timeout=args.header_timeout, backlog=args.backlog,
                on_ready=lambda bound: print(f"serving on http://{args.host}:{bound} "
                                             "(Ctrl-C to stop)", flush=True),
                **shape.gateway, **gateway_kwargs))
        else:
            port = args.port or free_port_run(shape.indices)
            for index in range(shape.api_servers):
                api = GatewayProcess(args, index, port, [e.port for e in engines], shape,
                                     state_dir)
                await api.start()
                children.append(api)
            print(f"serving on http://{args.host}:{port} (Ctrl-C to stop)", flush=True)
        supervisors = [loop.create_task(child.supervise()) for child in children]
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        stopper = loop.create_task(stop.wait())
        await asyncio.wait({stopper} | ({gateway} if gateway else set()),
                           return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if lifeline.orphaned():
            # Nobody is left to drain for, and the cleanup that matters is the engines'
            # (their sockets, the temporary state directory): their own lifelines stop them
            # without a grace period once this process is gone. Gone at once, then: an
            # orderly exit would close their subprocess transports, which SIGKILLs them.
            log.warning("stopping: the parent process is gone; the children follow")
            logging.shutdown()
            os._exit(128 + signal.SIGTERM)
        if gateway is None or not gateway.done():
            # Engines first: they refuse new work (503) and let in-flight streams finish
            # within the grace period while the gateways still relay them.
            log.info("stopping: draining the engines (grace %.1f s), then the gateways",
                     args.grace)
        for task in supervisors:
            task.cancel()
    finally:
        await asyncio.gather(*(e.stop(args.grace) for e in children if e in engines))
        await asyncio.gather(*(c.stop(args.grace) for c in children if c not in engines))
        if gateway is not None:
            gateway.cancel()
            try:
                await gateway
            except asyncio.CancelledError:
                pass


def run(args: argparse.Namespace) -> int:
    from inference_lab.cli import UsageError

    shape = layout(args)  # contradicting flags: refused before anything starts
    named = [(what, p) for what, p in (("the engine's gRPC port", args.engine_port),
                                        ("the engine's metrics port", args.metrics_port)) if p]
    if args.metrics_port:
        named += [(f"engine {k}'s metrics port", args.metrics_port + k)
                  for k in range(1, len(shape.engines))]
    if args.port:  # replica i on --port + i
        what = "rank" if shape.data_parallel else "replica"
        named += [(f"{what} {i}'s HTTP port", args.port + i) for i in shape.port_offsets]
    check_ports(args, named)  # clashing ports: refused before anything is bound
    load_deployments(args)  # refuse a bad config or workload before starting anything
    output_lengths(args)
    kv_roles(args)  # a P:D layout that does not fit --replicas: refused here
    gateway_kwargs = gateway_app_kwargs(args)  # [fault] tables and saved state checked too
    runner = loop_runner(args)
    try:
        runner(serve(args, gateway_kwargs))
    except (RuntimeError, OSError) as exc:
        raise UsageError(str(exc)) from None
    return 0
