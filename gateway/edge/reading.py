"""How long a client may take to send: the header deadline and the body deadline.

Knows: (1) a connection must deliver a complete header block within `header_timeout`
seconds of being accepted, and of the first byte of each later request on it; otherwise it
gets a 408 in the OpenAI envelope (gateway.errors) and is closed (`HeaderDeadline`). (2)
`read_body`: a body must arrive within BODY_TIMEOUT_S (a 408 otherwise), and bad framing
inside it is a 400, not a hang. Without them a client that opens thousands of connections
and sends half a header each holds a file descriptor per connection for aiohttp's
keep-alive timeout (75 s under AppRunner, an hour by default).

`read_body` works the same under any server; the header deadline only on the edge's
connections (gateway.edge.connection).

Does not know: what the connection does with a request, routes, the engine.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from inference_lab.gateway.aiohttp_gate import HttpProcessingError
from inference_lab.gateway.errors import (
    ErrorKind, GatewayError, envelope, from_parser_refusal,
)

log = logging.getLogger("inference_lab.gateway.edge")

DEFAULT_HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0  # a request body (at most 1 MiB) must arrive within this


async def read_body(request: web.BaseRequest, timeout: float | None = None) -> bytes:
    """The request body, read within `timeout` seconds (a 408 otherwise: a trickled body
    cannot hold a connection either); bad chunked framing is a 400. aiohttp keeps the bytes:
    a second call returns them at once."""
    timeout = BODY_TIMEOUT_S if timeout is None else timeout
    try:
        if request.content.is_eof():  # the whole body is in: no wait, so no deadline to arm
            return await request.read()
        async with asyncio.timeout(timeout):
            return await request.read()
    except TimeoutError:
        # no keep-alive after the 408: aiohttp closes once its lingering read (<= 10 s) ends
        request.protocol.close()
        raise GatewayError(ErrorKind.REQUEST_TIMEOUT,
                           f"Request body not received within {timeout:g} s.") from None
    except HttpProcessingError as exc:
        raise GatewayError(ErrorKind.INVALID_REQUEST,
                           f"Bad HTTP request body: {exc.message}") from None


class HeaderDeadline:
    """A connection's header deadline: armed when it is accepted and at the first bytes
    of each later request, disarmed once a header block is complete; when it passes the
    client gets the 408 and the connection is closed."""

    __slots__ = ("_connection", "timeout", "_timer")

    def __init__(self, protocol: web.RequestHandler, timeout: float) -> None:
        self._connection = protocol  # (the edge's connection: its transport, force_close)
        self.timeout = timeout
        self._timer: asyncio.TimerHandle | None = None

    @property
    def armed(self) -> bool:
        return self._timer is not None

    def arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.timeout > 0 and self._timer is None:
            self._timer = loop.call_later(self.timeout, self._late)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _late(self) -> None:
        self._timer = None
        protocol = self._connection
        transport = protocol.transport
        if transport is None or transport.is_closing():
            return
        log.info("closing a connection from %s: no complete request header within %.1f s",
                 transport.get_extra_info("peername"), self.timeout)
        body = envelope(from_parser_refusal(
            408, f"Request header not received within {self.timeout:g} s."))
        transport.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
                        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        protocol.force_close()
        transport.close()
