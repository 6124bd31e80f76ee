"""Running the gateway: an AppRunner and a TCPSite until the caller cancels.

Knows: how the aiohttp application is served: handler cancellation ON (a client that
disconnects cancels its handler at once, whose `finally` cancels the engine request), no
per-request access log (the gateway's /metrics counts requests; errors are logged one line
each), and an orderly shutdown on cancellation (stop accepting, then the app's cleanup_ctx
closes the engine Session).

Does not know: routes or the engine protocol (gateway.app), or command-line parsing
(inference_lab.cmd_gateway).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
from typing import Any, Callable

from aiohttp import web

from inference_lab.gateway import aiohttp_gate, edge, stamps
from inference_lab.gateway.edge import DEFAULT_HEADER_TIMEOUT_S

log = logging.getLogger("inference_lab.gateway.server")

# Runner settings the gateway relies on; use them when serving `create_app` elsewhere.
RUNNER_KWARGS: dict[str, Any] = {"handler_cancellation": True, "access_log": None}
SHUTDOWN_TIMEOUT_S = 5.0


DEFAULT_BACKLOG = 2048  # the listen queue, as vLLM's API server (aiohttp's default is 128)


async def start_gateway(
    app: web.Application, host: str = "127.0.0.1", port: int = 8080,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT_S, backlog: int = DEFAULT_BACKLOG,
) -> tuple[web.AppRunner, int]:
    """Start serving `app`; returns the runner (call `runner.cleanup()`) and the bound port
    (useful with port 0). Connections answer malformed HTTP with the JSON envelope and must
    send a complete header block within `header_timeout` seconds (gateway.edge); a
    request's arrival is its bytes' kernel receive instant where the host gives it
    (gateway.stamps); both while aiohttp's fast paths are on (gateway.aiohttp_gate).
    `backlog`: the listening socket's accept queue."""
    runner = edge.runner(app, shutdown_timeout=SHUTDOWN_TIMEOUT_S,
                         header_timeout=header_timeout, **RUNNER_KWARGS)
    await runner.setup()
    try:
        sock = stamps.listen(host, port, backlog) if aiohttp_gate.fast_paths() else None
        site = (web.TCPSite(runner, host, port, backlog=backlog) if sock is None
                else web.SockSite(runner, sock, backlog=backlog))
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    addresses = runner.addresses
    return runner, (addresses[0][1] if addresses else port)


async def run_gateway(
    engine_target: str, host: str = "127.0.0.1", port: int = 8080,
    on_ready: Callable[[int], None] | None = None,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT_S, backlog: int | None = None,
    **app_kwargs: Any
) -> None:
    """Serve the gateway for the engine at `engine_target` until cancelled: replica i of
    the engine's models on `port` + i (gateway.fleet; only `port` with one replica).

    `on_ready(bound_port)` is called once it listens. `app_kwargs` go to `create_app`
    (max_body_bytes, api_key, control_token, disconnect_poll_s).
    """
    from inference_lab.gateway.fleet import FleetGateway

    fleet = FleetGateway(engine_target, host, port, header_timeout=header_timeout,
                         backlog=backlog or DEFAULT_BACKLOG, **app_kwargs)
    bound = await fleet.start()
    # Everything allocated so far lives as long as the process: keep it out of the
    # collector's full passes, and collect the young generation less often (each request
    # allocates many short-lived objects; frequent passes show up as latency spikes).
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 100)
    # grpc.aio's poller thread hands events to the loop; with the default 5 ms GIL switch
    # interval it waits behind a busy loop (BENCHMARKS.md: 529 p50 3.2 -> 1.7 ms).
    sys.setswitchinterval(0.0005)
    log.info("gateway listening on http://%s:%d (engine %s)", host, bound, engine_target)
    if on_ready is not None:
        on_ready(bound)
    try:
        await asyncio.Event().wait()  # until cancelled
    finally:
        await fleet.stop()
        log.info("gateway stopped")
