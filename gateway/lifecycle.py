"""A gateway app's start and stop (its cleanup_ctx), and what runs while it serves.

Knows: the app's engine client (its own, or the fleet's shared one, gateway.fleet), opened
in the background as the app starts and closed when it stops (unless shared), and the
watchdog that cancels the engine requests of clients who left, for runners without
handler cancellation.

Does not know: routes (gateway.app), the engine protocol (gateway.engine_client).
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from aiohttp import web

from inference_lab.gateway.engine_client import ClientGone, EngineClient
from inference_lab.gateway.state import STATE, GatewayState


async def engine_ctx(app: web.Application) -> AsyncIterator[None]:
    """The app's engine client and watchdog, from start to stop."""
    state = app[STATE]
    state.engine = state.shared_engine or EngineClient(state.engine_target,
                                                       control_token=state.control_token,
                                                       api_key=state.api_key,
                                                       session_lane=state.session_lane)
    state.engine.connect_soon()
    watchdog = asyncio.get_running_loop().create_task(_disconnect_watchdog(state))
    yield
    watchdog.cancel()
    await asyncio.gather(watchdog, return_exceptions=True)
    engine, state.engine = state.engine, None
    if state.shared_engine is None:
        await engine.close()


async def _disconnect_watchdog(state: GatewayState) -> None:
    """Cancels engine requests whose HTTP client has gone. With handler_cancellation (as
    `run_gateway` and aiohttp's TestServer run) the handler's own `finally` does it at
    once; this covers runners without it, within `disconnect_poll_s`."""
    while True:
        await asyncio.sleep(state.disconnect_poll_s)
        engine = state.engine
        if engine is None:
            continue
        for stream, request in list(state.inflight.items()):
            transport = request.transport
            if transport is None or transport.is_closing():
                engine.cancel(stream, ClientGone())
