"""Running the gateway process: every replica's listener until the caller cancels.

Knows: that the gateway serves the engine's replicas on consecutive ports
(gateway.fleet), the process settings a busy gateway needs once it is up (the collector
kept off what lives as long as the process, a short GIL switch interval for grpc.aio's
poller thread), and the order of shutdown (the listeners, then the engine client).

Does not know: routes (gateway.app), how one app is served (gateway.server), or
command-line parsing (inference_lab.cli.cmd_gateway).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
from typing import Any, Callable

from inference_lab.gateway.edge import DEFAULT_HEADER_TIMEOUT_S
from inference_lab.gateway.fleet import FleetGateway
from inference_lab.gateway.server import DEFAULT_BACKLOG

log = logging.getLogger("inference_lab.gateway.server")  # the start and stop lines


async def run_gateway(
    engine_target: str | list[str], host: str = "127.0.0.1", port: int = 8080,
    on_ready: Callable[[int], None] | None = None,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT_S, backlog: int | None = None,
    **app_kwargs: Any
) -> None:
    """Serve the gateway for the engine at `engine_target` (or the engines sharing one
    fleet: a list) until cancelled: replica i of the engine's models on `port` + i
    (gateway.fleet; only `port` with one replica, or with data-parallel ranks balanced
    behind it).

    `on_ready(bound_port)` is called once it listens. `app_kwargs` go to `create_app`
    (max_body_bytes, api_key, control_token, disconnect_poll_s).
    """
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
    # interval it waits behind a busy loop (a 529's latency shows it).
    sys.setswitchinterval(0.0005)
    log.info("gateway listening on http://%s:%d (engine %s)", host, bound, fleet.engine_target)
    if on_ready is not None:
        on_ready(bound)
    try:
        await asyncio.Event().wait()  # until cancelled
    finally:
        await fleet.stop()
        log.info("gateway stopped")
