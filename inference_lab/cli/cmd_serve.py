"""`inference-lab serve`: engine and gateway as one command (the embedded default).

Knows the process tree: the engine runs as a child process (`inference-lab engine`, its
own core for the pacer), the gateway in this process. Validates the configs before
anything starts, restarts the engine if it dies (the gateway answers 503 meanwhile and
reconnects by itself), and on Ctrl-C / SIGTERM drains the engine, then stops the gateway.
Its children are bound to it (common.lifeline): if it dies, even by SIGKILL, the engine
stops without a grace period and removes the temporary state directory (it is told the
directory is temporary); if its own parent dies, it exits at once and leaves the engine to
that lifeline.
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
from inference_lab.cli.cmd_engine import (
    add_model_arguments, add_run_arguments, check_ports, kv_roles, load_deployments, lora_argv,
    output_lengths,
)
from inference_lab.cli.cmd_gateway import add_gateway_arguments, gateway_app_kwargs, loop_runner
from inference_lab.cli.flag_types import port
from inference_lab.common import lifeline
from inference_lab.common.ports import free_port

log = logging.getLogger("inference_lab.serve")

HELP = """\
Serve the OpenAI-compatible API on a simulated GPU engine: the engine runs as a child
process, the gateway here. With no --config it serves the embedded gpt-oss-20b.

  inference-lab serve                                   # gpt-oss-20b on a B200 at :8080
  inference-lab serve --config configs/ --hardware b200 --max-waiting 64
  inference-lab serve --replicas 4 --startup-delay auto  # replica i on :8080 + i

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
    p.set_defaults(func=run)


class EngineProcess:
    """The engine child: started, watched, restarted when it dies, stopped on request."""

    def __init__(self, args: argparse.Namespace, port: int, state_dir: str,
                 state_dir_temporary: bool = False) -> None:
        self.port = port
        self.argv = [sys.executable, "-P", "-m", "inference_lab", "--log-level", args.log_level,
                     "engine", "--hardware", args.hardware, "--host", "127.0.0.1",
                     "--port", str(port), "--metrics-port", str(args.metrics_port),
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
        if args.kv_events_config:
            self.argv += ["--kv-events-config", args.kv_events_config]
        if args.kv_events_expose_replay:
            self.argv.append("--kv-events-expose-replay")
        self.argv += lora_argv(args)
        for directory in args.catalog:
            self.argv += ["--catalog", str(directory)]
        if args.timing is not None:
            self.argv += ["--timing", args.timing]
        if args.kv_cache_dtype is not None:
            self.argv += ["--kv-cache-dtype", args.kv_cache_dtype]
        if args.replicas != 1 or args.startup_delay:
            self.argv += ["--replicas", str(args.replicas),
                          "--startup-delay", str(args.startup_delay)]
        if args.kv_roles:
            self.argv += ["--kv-roles", args.kv_roles]
        self.argv += ["--kv-link", args.kv_link, "--kv-abort-timeout", repr(args.kv_abort_timeout)]
        self.argv += ["--seed", str(args.seed), "--default-max-tokens", str(args.default_max_tokens)]
        if args.workload is not None:
            self.argv += ["--workload", os.path.abspath(args.workload)]
        # The engine requires the gateway's secrets too (engine.service.access); through
        # the environment, never argv (which any local user can list). A variable set
        # outside but overridden by a flag, or unset, is not passed on.
        secrets = {API_KEY_ENV: api_key(args), CONTROL_TOKEN_ENV: control_token(args)}
        self.env = lifeline.child_env({**{k: v for k, v in os.environ.items() if k not in secrets},
                                       **{k: v for k, v in secrets.items() if v}})
        self.proc: asyncio.subprocess.Process | None = None
        self.stopping = False

    async def start(self) -> None:
        # On the loop's thread, the main one: the engine's lifeline fires when the thread
        # that forked it exits.
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
            env=self.env, start_new_session=True)  # Ctrl-C reaches us; we stop the engine in order
        try:
            async with asyncio.timeout(READY_TIMEOUT_S):
                line = await self.proc.stdout.readline()
        except TimeoutError:  # alive but not ready in time: give up on it
            line = b""
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        if not line.startswith(b"engine ready"):
            code = await self.proc.wait()
            raise RuntimeError(f"the engine did not start (exit status {code}); see its log above")
        print(f"engine started: pid {self.proc.pid}, {line.decode().strip()}", flush=True)
        asyncio.get_running_loop().create_task(self._drain_stdout(self.proc))

    @staticmethod
    async def _drain_stdout(proc: asyncio.subprocess.Process) -> None:
        while await proc.stdout.readline():
            pass

    async def supervise(self) -> None:
        """Restart the engine whenever it exits without being asked to."""
        while not self.stopping:
            code = await self.proc.wait()
            if self.stopping:
                return
            log.error("engine exited with status %s; the gateway answers 503 until it is back. "
                      "Restarting in %.0f s", code, RESTART_DELAY_S)
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


async def serve(args: argparse.Namespace, gateway_kwargs: dict) -> None:
    with contextlib.ExitStack() as stack:
        # Without --state-dir, live state still outlives an engine restart: a directory
        # for this run only.
        # (The engine removes it too when this process dies first: errors ignored here.)
        temporary = args.state_dir is None
        state_dir = str(args.state_dir) if not temporary else stack.enter_context(
            tempfile.TemporaryDirectory(prefix="inference-lab-state-", ignore_cleanup_errors=True))
        await _serve(args, gateway_kwargs, state_dir, temporary)


async def _serve(args: argparse.Namespace, gateway_kwargs: dict, state_dir: str,
                 state_dir_temporary: bool) -> None:
    from inference_lab.gateway.run import run_gateway

    engine = EngineProcess(args, args.engine_port or free_port(), state_dir, state_dir_temporary)
    await engine.start()
    supervisor = asyncio.get_running_loop().create_task(engine.supervise())
    gateway = asyncio.get_running_loop().create_task(run_gateway(
        f"127.0.0.1:{engine.port}", host=args.host, port=args.port,
        header_timeout=args.header_timeout, backlog=args.backlog,
        on_ready=lambda bound: print(f"serving on http://{args.host}:{bound} (Ctrl-C to stop)",
                                     flush=True),
        **gateway_kwargs))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    stopper = loop.create_task(stop.wait())
    await asyncio.wait({gateway, stopper}, return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    if lifeline.orphaned():
        # Nobody is left to drain for, and the cleanup that matters is the engine's (its
        # sockets, the temporary state directory): its own lifeline stops it without a
        # grace period once this process is gone. Gone at once, then: an orderly exit
        # would close the engine's subprocess transport, which SIGKILLs it.
        log.warning("stopping: the parent process is gone; the engine follows")
        logging.shutdown()
        os._exit(128 + signal.SIGTERM)
    if not gateway.done():
        # Engine first: it refuses new work (503) and lets in-flight streams finish
        # within the grace period while the gateway still relays them.
        log.info("stopping: draining the engine (grace %.1f s), then the gateway", args.grace)
        await engine.stop(args.grace)
        gateway.cancel()
    supervisor.cancel()
    await engine.stop(args.grace)
    try:
        await gateway
    except asyncio.CancelledError:
        pass


def run(args: argparse.Namespace) -> int:
    from inference_lab.cli import UsageError

    named = [(what, p) for what, p in (("the engine's gRPC port", args.engine_port),
                                        ("the engine's metrics port", args.metrics_port)) if p]
    if args.port:  # replica i on --port + i
        named += [(f"replica {i}'s HTTP port", args.port + i) for i in range(args.replicas)]
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
