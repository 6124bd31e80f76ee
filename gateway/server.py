"""Serving one gateway app: an AppRunner on a listening socket (`start_gateway`).

Knows: how the aiohttp application is served: handler cancellation ON (a client that
disconnects cancels its handler at once, whose `finally` cancels the engine request), no
per-request access log (the gateway's /metrics counts requests; errors are logged one line
each), and an orderly shutdown (`runner.cleanup()`: stop accepting, then the app's
cleanup_ctx closes the engine Session).

Does not know: routes or the engine protocol (gateway.app), the replicas' listeners
(gateway.fleet), the process (gateway.run), or command-line parsing
(inference_lab.cli.cmd_gateway).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from inference_lab.gateway import aiohttp_gate, edge, stamps
from inference_lab.gateway.edge import DEFAULT_HEADER_TIMEOUT_S

# Runner settings the gateway relies on; use them when serving `create_app` elsewhere.
RUNNER_KWARGS: dict[str, Any] = {"handler_cancellation": True, "access_log": None}
SHUTDOWN_TIMEOUT_S = 5.0


DEFAULT_BACKLOG = 2048  # the listen queue, as vLLM's API server (aiohttp's default is 128)


async def start_gateway(
    app: web.Application, host: str = "127.0.0.1", port: int = 8080,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT_S, backlog: int = DEFAULT_BACKLOG,
    reuse_port: bool = False,
) -> tuple[web.AppRunner, int]:
    """Start serving `app`; returns the runner (call `runner.cleanup()`) and the bound port
    (useful with port 0). Connections answer malformed HTTP with the JSON envelope and must
    send a complete header block within `header_timeout` seconds (gateway.edge); a
    request's arrival is its bytes' kernel receive instant where the host gives it
    (gateway.stamps); both while aiohttp's fast paths are on (gateway.aiohttp_gate).
    `backlog`: the listening socket's accept queue. `reuse_port`: share the port with
    other processes (SO_REUSEPORT: the API servers of one lab)."""
    runner = edge.runner(app, shutdown_timeout=SHUTDOWN_TIMEOUT_S,
                         header_timeout=header_timeout, **RUNNER_KWARGS)
    await runner.setup()
    try:
        sock = (stamps.listen(host, port, backlog, reuse_port) if aiohttp_gate.fast_paths()
                else None)
        site = (web.TCPSite(runner, host, port, backlog=backlog, reuse_port=reuse_port or None)
                if sock is None
                else web.SockSite(runner, sock, backlog=backlog))
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    addresses = runner.addresses
    return runner, (addresses[0][1] if addresses else port)
