"""`serve`'s process tree: how many engine and gateway processes, and what each is told.

Knows vLLM's way of growing with cores, and the flags that spell it: API servers
(`--api-server-count A`: A gateway processes sharing the HTTP ports through SO_REUSEPORT,
each with a client of every engine), data-parallel ranks (`--data-parallel-size D`: one
engine process per rank; `--data-parallel-size-local L` and `--data-parallel-start-rank S`
run ranks S .. S + L - 1 here; internal load balancing by default: one port, the
balancer's pick or the rank `X-data-parallel-rank` names; `--data-parallel-external-lb`:
rank k on --port + k, for a router; `--data-parallel-hybrid-lb`: the local ranks behind
one port, which on one machine is the internal mode), and independent replicas spread
over engine processes (`--replicas N --engine-processes P`: replica index i in process
i mod P). Turns them into each engine child's fleet flags and the gateways' fleet
arguments, and refuses what contradicts (a UsageError naming the flags).

Does not know: how the processes are started or watched (cli.cmd_serve), what they do.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from inference_lab.cli.flag_types import number

AUTO = 0  # --engine-processes auto


def add_scale_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of the process tree (serve only)."""
    count = number(int, lambda v: 1 <= v <= 64, "an integer in 1..64")
    p.add_argument("--api-server-count", type=count, default=1, metavar="A",
                   help="API server (gateway) processes sharing the HTTP ports (SO_REUSEPORT: "
                        "the kernel spreads connections over them), each with a client of every "
                        "engine process, as vLLM's --api-server-count. One process relays about "
                        "64 streams of gpt-oss-20b on a B200 one token a write; each more "
                        "relays as many again, given a core (docs/architecture.md, 'Sizing a "
                        "machine'). Default 1: the gateway runs in this process")
    p.add_argument("--engine-processes", type=_processes, default=AUTO, metavar="P|auto",
                   help="engine processes the --replicas share (replica i in process i mod P), "
                        "so replicas do not share one core. auto (default): one per core left "
                        "after the API servers, at most one per replica, at least 1. P/D "
                        "replicas (--kv-roles) stay in one process")
    p.add_argument("--data-parallel-size-local", type=count, default=None, metavar="L",
                   help="vLLM's: the data-parallel ranks run on this machine (default: all D)")
    p.add_argument("--data-parallel-start-rank", type=number(int, lambda v: v >= 0,
                                                            "an integer >= 0"),
                   default=0, metavar="S",
                   help="vLLM's: the rank of this machine's first local rank (default 0)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--data-parallel-external-lb", action="store_true",
                      help="vLLM's external load balancing: rank k answers on --port + k as a "
                           "server of its own, for a router in front (default: internal "
                           "balancing, every rank behind --port)")
    mode.add_argument("--data-parallel-hybrid-lb", action="store_true",
                      help="vLLM's hybrid load balancing: this machine's ranks balanced behind "
                           "--port (a router spreads over machines); on one machine the same "
                           "as internal balancing")


def _processes(text: str) -> int:
    if text == "auto":
        return AUTO
    value = number(int, lambda v: 1 <= v <= 64, "auto or an integer in 1..64")(text)
    return value


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class ServeLayout:
    """Every engine child's fleet flags, and the gateways' fleet arguments."""

    engines: list[list[str]]  # per engine process, the fleet flags it is started with
    api_servers: int
    gateway: dict = field(default_factory=dict)  # run_gateway's fleet arguments
    indices: int = 1  # replica indices of the fleet (ports base .. base + indices - 1)
    port_offsets: list[int] = field(default_factory=lambda: [0])  # each index's port offset
    data_parallel: str | None = None  # "internal" or "external" (None: independent replicas)
    start_rank: int = 0

    def describe(self) -> str:
        what = (f"{len(self.engines)} data-parallel rank{'s' * (len(self.engines) > 1)} "
                f"({self.data_parallel} balancing)" if self.data_parallel else
                f"{self.indices} replica{'s' * (self.indices > 1)} over {len(self.engines)} "
                f"engine process{'es' * (len(self.engines) > 1)}")
        return f"{what}, {self.api_servers} API server{'s' * (self.api_servers > 1)}"


def layout(args: argparse.Namespace) -> ServeLayout:
    """The process tree the flags ask for; UsageError where they contradict."""
    from inference_lab.cli import UsageError

    dp = args.data_parallel_size
    local = args.data_parallel_size_local
    start = args.data_parallel_start_rank
    api = args.api_server_count
    if dp > 1 or local is not None or start:
        from inference_lab.cli.cmd_engine import refuse_replicas_beside_ranks

        refuse_replicas_beside_ranks(args)
        if args.engine_processes != AUTO:
            raise UsageError("--engine-processes is for --replicas: data-parallel ranks run "
                             "one engine process each")
        if args.data_parallel_external_lb and start:
            raise UsageError("--data-parallel-external-lb with --data-parallel-start-rank: "
                             "rank k answers on --port + k, so run every rank of an external "
                             "layout from rank 0 on one machine (or one `serve` per rank)")
        local = dp - start if local is None else local
        if start + local > dp or local < 1:
            raise UsageError(f"--data-parallel-start-rank {start} + --data-parallel-size-local "
                             f"{local} must be within --data-parallel-size {dp}")
        ranks = list(range(start, start + local))
        mode = "external" if args.data_parallel_external_lb else "internal"
        engines = [["--data-parallel-size", str(dp), "--data-parallel-rank", str(r)]
                   for r in ranks]
        gateway = {"owners": [[r] for r in ranks], "data_parallel": True,
                   "balance": mode == "internal", "replica_ports": mode == "external"}
        offsets = [r - start for r in ranks] if mode == "external" else [0]
        return ServeLayout(engines, api, gateway, indices=len(ranks), port_offsets=offsets,
                           data_parallel=mode, start_rank=start)
    if args.data_parallel_external_lb or args.data_parallel_hybrid_lb:
        raise UsageError("--data-parallel-external-lb and --data-parallel-hybrid-lb need "
                         "--data-parallel-size > 1")
    replicas = args.replicas
    processes = args.engine_processes
    if args.kv_roles:
        if processes not in (AUTO, 1):
            raise UsageError("--kv-roles: prefill and decode replicas hand KV over within one "
                             "engine process; --engine-processes must be 1")
        processes = 1
    elif processes == AUTO:
        processes = min(replicas, max(1, cores() - api))
    processes = min(processes, replicas)
    if processes == 1:
        engines = [["--replicas", str(replicas)] if replicas != 1 else []]
    else:
        engines = [["--replicas", str(replicas), "--replica-shard", f"{p}/{processes}"]
                   for p in range(processes)]
    return ServeLayout(engines, api, {}, indices=replicas,
                       port_offsets=list(range(replicas)))
