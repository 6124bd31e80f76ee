"""The edge's connection: aiohttp's protocol with the edge's concerns put together, and
the runner that serves it.

Knows: the order in which a read goes through them (stamped on arrival,
gateway.edge.arrivals; answered at once when it is exactly one request the app answers
fast, gateway.edge.fast; else parsed by aiohttp, its generation requests marked in the
backlog and the header deadline met or re-armed, gateway.edge.reading), the send deadline
on pause and resume (gateway.edge.sending), what a connection's end releases, and
`handle_error`: what aiohttp's HTTP parser refuses (a bad request line, an invalid header,
too many headers, a header line over 8190 bytes, bad chunked framing of a body) is
answered in the OpenAI error envelope from the one error table (gateway.errors:
`bad_http_request` with aiohttp's own reason as the message, and so on by status) instead
of aiohttp's plain text, with the same status, and the connection is closed as aiohttp
does. Where aiohttp does not allow the envelope, it is not sent: a parse error after the
response has begun (the connection is only closed), a connection reset, and a TLS or
non-HTTP handshake that never becomes a request line (aiohttp logs it at DEBUG and closes).

A fast answer is taken only on a kept-alive HTTP/1.1 connection that is idle (aiohttp has
served a request on it, holds no partial one and handles none) and whose output is flushed
(most of a /metrics scrape's CPU is aiohttp's request objects: see
docs/benchmarks.md, "Replicas (fleet)").

`runner` serves these connections only while aiohttp_gate's fast paths are on; otherwise
it is aiohttp's own AppRunner: no fast answers, no header or send deadline, no receive
stamps or backlog marks, aiohttp's own answers to malformed HTTP.

Does not know: routes or the engine (gateway.app).
"""

from __future__ import annotations

import asyncio
import functools

from aiohttp import web

from inference_lab.gateway import aiohttp_gate
from inference_lab.gateway.aiohttp_gate import HttpProcessingError
from inference_lab.gateway.edge.arrivals import ARRIVALS, Marks, received_now
from inference_lab.gateway.edge.fast import FAST_GETS, FAST_POSTS, fast_get, fast_post
from inference_lab.gateway.edge.reading import DEFAULT_HEADER_TIMEOUT_S, HeaderDeadline
from inference_lab.gateway.edge.sending import SendDeadline
from inference_lab.gateway.errors import envelope, from_parser_refusal
from inference_lab.gateway.stamps import StampedSocket


class EdgeRequestHandler(aiohttp_gate.GateRequestHandler):
    """One HTTP connection (aiohttp's protocol) with JSON refusals and the deadlines."""

    __slots__ = ("_headers", "_sends", "received_at", "_fast", "_fast_gets", "_fast_posts",
                 "_stamped", "_marks")

    def __init__(self, *args, header_timeout: float = DEFAULT_HEADER_TIMEOUT_S,
                 send_timeout: float | None = None,
                 fast: dict | None = None, fast_posts: dict | None = None,
                 arrivals: tuple | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._headers = HeaderDeadline(self, header_timeout)
        self._sends = SendDeadline(self, send_timeout)
        self.received_at: float | None = None  # time.monotonic() of the latest bytes read
        self._stamped: StampedSocket | None = None  # reads with kernel receive stamps
        self._fast_gets = fast or None  # FAST_GETS
        self._fast_posts = fast_posts or None  # FAST_POSTS
        self._fast = self._fast_gets is not None or self._fast_posts is not None
        # (paths, Backlog): generation requests read are marked until sent or answered
        self._marks = Marks(self, arrivals[0], arrivals[1]) if arrivals else None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        raw = aiohttp_gate.raw_socket(transport)
        self._stamped = raw if isinstance(raw, StampedSocket) else None
        self._headers.arm(self.event_loop)

    def data_received(self, data: bytes) -> None:
        # (the stamped socket's read of `data` has just stamped it: gateway.stamps)
        self.received_at = received_now(self._stamped)
        if self._fast and self._answered_fast(data):
            return
        parsed = self.requests_parsed
        super().data_received(data)
        new = self.requests_parsed - parsed
        if self._marks is not None:
            self._marks.parsed(self.last_parsed(new), self.received_at)
        if new:
            self._headers.disarm()  # a complete header block: the deadline is met
            if self.body_error_to_handler(HttpProcessingError):
                self.close()  # (the handler answers 400; then the connection goes)
        elif data and not self._headers.armed and self.between_requests():
            self._headers.arm(self.event_loop)  # the first bytes of a later request

    def _answered_fast(self, data: bytes) -> bool:
        """`data` answered without aiohttp's request, handler task and response objects:
        only on an idle kept-alive connection with no header deadline running, for `data`
        that is exactly one complete request the app answers fast (FAST_GETS,
        FAST_POSTS). Anything else (and an answer of None) goes to aiohttp as it came."""
        if self._headers.armed or not self.idle():
            return False
        if data.startswith(b"GET /"):
            gets = self._fast_gets
            response = fast_get(data, gets) if gets is not None else None
        elif data.startswith(b"POST /"):
            posts = self._fast_posts
            response = fast_post(data, posts, self.received_at) if posts is not None else None
        else:
            return False
        if response is None:
            return False
        self.answered(response)
        return True

    def pause_writing(self) -> None:
        super().pause_writing()
        self._sends.paused(self.event_loop)

    def resume_writing(self) -> None:
        self._sends.resumed()
        super().resume_writing()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._headers.disarm()
        self._sends.stop()
        if self._marks is not None:
            self._marks.release(gone=True)
        super().connection_lost(exc)

    def handle_error(self, request: web.BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if self._marks is not None:
            self._marks.release()  # (answered here, never sent)
        resp = super().handle_error(request, status, exc, message)  # logs; raises if sent
        reason = message or (exc.message if hasattr(exc, "message") else None) or resp.reason
        text = f"Bad HTTP request: {reason}" if status < 500 else "Internal server error."
        out = web.Response(status=status, body=envelope(from_parser_refusal(status, text)),
                           content_type="application/json")
        out.force_close()
        return out


def runner(app: web.Application, *, header_timeout: float = DEFAULT_HEADER_TIMEOUT_S,
           send_timeout: float | None = None, **kwargs) -> web.AppRunner:
    """The AppRunner serving `app` (aiohttp's `kwargs`): through EdgeRequestHandlers with
    the app's FAST_GETS, FAST_POSTS and ARRIVALS while the fast paths are on
    (gateway.aiohttp_gate), else aiohttp's own. `send_timeout` None: SEND_TIMEOUT_S."""
    if not aiohttp_gate.fast_paths():
        return web.AppRunner(app, **kwargs)

    def connections(started: web.Application):
        arrivals = started.get(ARRIVALS)  # (after the app's start-up: its backlog exists)
        if arrivals is not None:
            paths, backlog = arrivals[0], arrivals[1]()
            arrivals = (paths, backlog) if backlog is not None else None
        return functools.partial(EdgeRequestHandler, header_timeout=header_timeout,
                                 send_timeout=send_timeout,
                                 fast=started.get(FAST_GETS) or None,
                                 fast_posts=started.get(FAST_POSTS) or None,
                                 arrivals=arrivals)

    return aiohttp_gate.ConnectionRunner(app, connections, **kwargs)
