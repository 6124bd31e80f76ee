"""The gateway's connections before there is a request: malformed HTTP and slow headers.

Knows: the gateway's connection protocol (`EdgeRequestHandler`, built on aiohttp's through
gateway.aiohttp_gate, which alone touches aiohttp's private state, and served by `runner`
only while the gate's fast paths are on). (1) `handle_error`, which aiohttp calls for what
its HTTP parser refuses (a bad request line, an invalid header, too many headers, a header
line over 8190 bytes, bad chunked framing of a body): the answer is the OpenAI error
envelope (`invalid_request_error` / `bad_http_request`, aiohttp's own reason as the
message) instead of aiohttp's plain text, with the same status, and the connection is
closed as aiohttp does. (2) A header-read timeout: a connection must deliver a complete
header block within `header_timeout` seconds of being accepted, and of the first byte of
each later request on it; otherwise it gets a 408 in the same envelope and is closed. (3)
`read_body`: a body must arrive within BODY_TIMEOUT_S, and bad framing inside it is a 400,
not a hang. Without this a client that opens thousands of connections and sends half a
header each holds a file descriptor per connection for aiohttp's keep-alive timeout (75 s
under AppRunner, an hour by default). (4) `received_at`: the time.monotonic() of the
connection's latest bytes, which `arrival_stamp` turns into a request's arrival instant
(inference_lab.common.clock): the kernel's receive instant where the listener gives it
(gateway.stamps), else the read's. (5) `FAST_GETS`: GET paths the app answers
synchronously (a replica port's /metrics, every 50 ms per scraper), written here without
aiohttp's request, task and response objects when the read is exactly one plain GET of
such a path on an idle kept-alive connection whose output is flushed; anything else is
aiohttp's, as it came. (6) `FAST_POSTS`: the same for POST paths whose app may answer a
request from its headers and body alone (the generation routes' 529 while the model is
saturated): the read must be exactly one POST of such a path with a Content-Length body,
plain headers (no Transfer-Encoding, Content-Encoding, Expect, Upgrade or Origin, a
Connection header only as keep-alive, no header twice); the app's answer of None (not a
refusal, a 400, anything unusual) hands the read to aiohttp unchanged. (7) A send
deadline: once the client's socket pushes back (asyncio pauses the connection's writing),
the bytes waiting for it must shrink within SEND_TIMEOUT_S, and again each SEND_TIMEOUT_S
until writing resumes; a client that stops reading has its connection aborted, which ends
the response's handler as a hang-up does (aiohttp alone would wait on the drain for ever,
holding the response's bytes).

With the fast paths off (gateway.aiohttp_gate) `runner` is aiohttp's own AppRunner: none of
(1), (2), (4), (5), (6), (7) and no backlog marks; `read_body` and `arrival_stamp` (the handler's
read instant) work the same under any server.

Where aiohttp does not allow the envelope, it is not sent: a parse error after the
response has begun (the connection is only closed), a connection reset, and a TLS or
non-HTTP handshake that never becomes a request line (aiohttp logs it at DEBUG and closes).

Does not know: routes or the engine (gateway.app).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import struct
import sys
import time

from aiohttp import web

from inference_lab.gateway import aiohttp_gate
from inference_lab.gateway.aiohttp_gate import HttpProcessingError
from inference_lab.gateway.errors import ErrorKind, GatewayError
from inference_lab.gateway.protocols.base import json_encode
from inference_lab.gateway.stamps import StampedSocket

log = logging.getLogger("inference_lab.gateway.edge")

DEFAULT_HEADER_TIMEOUT_S = 10.0
# GET paths an app answers without aiohttp's request machinery (path -> answer(request_id)
# -> the whole response as a sequence of bytes, or None to let aiohttp handle the request)
FAST_GETS = web.AppKey("fast_gets", dict)
_FAST_REFUSED = (b"\r\nconnection:", b"\r\ncontent-length:", b"\r\ntransfer-encoding:",
                 b"\r\nexpect:", b"\r\nupgrade:",
                 b"\r\norigin:")  # (a browser's request: aiohttp's, for the CORS header)
# POST paths an app may answer from the request's headers and body alone (path ->
# answer(headers, body, stamp) -> the whole response as a sequence of bytes, or None to let
# aiohttp handle the request; headers: lower-case name -> value, both bytes, each name once;
# stamp: the request's arrival, time.monotonic())
FAST_POSTS = web.AppKey("fast_posts", dict)
# The app's generation routes and its backlog of them (gateway.backlog), as a callable run
# once the app has started: every POST of one of these paths is marked in the backlog
# from the moment its last bytes are read until the app clears it (sent or answered).
ARRIVALS = web.AppKey("arrivals", tuple)
_POST_REFUSED = frozenset((b"transfer-encoding", b"content-encoding", b"expect", b"upgrade",
                           b"origin"))  # and a Connection header other than keep-alive
# one header line as the fast POST takes it: a token name, visible ASCII in the value
# (inner spaces and tabs allowed, none empty); anything else is aiohttp's to judge
_POST_HEAD_MAX = 4096  # (within aiohttp's 8190-byte line limits: a longer head is its to judge)
_NAME, _VALUE = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+", rb"[!-~](?:[ \t!-~]*[!-~])?"
_HEADER = re.compile(rb"(%s):[ \t]*(%s)[ \t]*\r\n" % (_NAME, _VALUE))
_HEADERS = re.compile(rb"(?:%s:[ \t]*%s[ \t]*\r\n)*" % (_NAME, _VALUE))
BODY_TIMEOUT_S = 30.0  # a request body (at most 1 MiB) must arrive within this
# A response the client stops reading: once the socket pushes back (asyncio pauses the
# connection's writing), the bytes waiting must shrink within this many seconds, again and
# again until the socket takes more, or the connection is aborted.
SEND_TIMEOUT_S = 30.0
if sys.platform == "linux":  # a socket's unsent bytes (the kernel's send queue)
    import fcntl
    import termios
    _OUTQ: int | None = termios.TIOCOUTQ
else:  # (elsewhere the transport's buffer alone says whether bytes left)
    _OUTQ = None
_CODES = {400: "bad_http_request", 408: "request_timeout", 413: "request_too_large",
          431: "headers_too_large", 500: "internal_error", 501: "not_implemented",
          505: "http_version_not_supported"}


def envelope(status: int, message: str) -> bytes:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return json_encode({"error": {"message": message, "type": kind,
                                  "code": _CODES.get(status, "bad_http_request")}})


def arrival_stamp(request: web.BaseRequest) -> float:
    """When the gateway finished reading `request` (time.monotonic()), for a caller whose
    body is read: the arrival of the connection's latest bytes, the body's last (later
    bytes, a pipelined next request, only make it later). Under a server that is not
    the edge's: now."""
    stamp = getattr(request.protocol, "received_at", None)
    return time.monotonic() if stamp is None else stamp


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


class EdgeRequestHandler(aiohttp_gate.GateRequestHandler):
    """One HTTP connection (aiohttp's protocol) with JSON refusals and a header deadline."""

    __slots__ = ("_header_timeout", "_header_timer", "received_at", "_fast", "_fast_gets",
                 "_fast_posts", "_stamped", "_backlog", "_arrival_paths", "_body_awaited",
                 "_send_timeout", "_send_timer", "_send_waiting")

    def __init__(self, *args, header_timeout: float = DEFAULT_HEADER_TIMEOUT_S,
                 send_timeout: float | None = None,
                 fast: dict | None = None, fast_posts: dict | None = None,
                 arrivals: tuple | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._header_timeout = header_timeout
        self._header_timer: asyncio.TimerHandle | None = None
        self._send_timeout = SEND_TIMEOUT_S if send_timeout is None else send_timeout
        self._send_timer: asyncio.TimerHandle | None = None
        self._send_waiting = 0  # bytes the transport held when the send timer was armed
        self.received_at: float | None = None  # time.monotonic() of the latest bytes read
        self._stamped: StampedSocket | None = None  # reads with kernel receive stamps
        self._fast_gets = fast or None  # FAST_GETS
        self._fast_posts = fast_posts or None  # FAST_POSTS
        self._fast = self._fast_gets is not None or self._fast_posts is not None
        # (paths, Backlog): generation requests read are marked until sent or answered
        self._backlog = arrivals[1] if arrivals else None
        self._arrival_paths = arrivals[0] if self._backlog is not None else frozenset()
        self._body_awaited = None  # a marked route's body still on its way (its payload)

    # ---- the header deadline -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        raw = aiohttp_gate.raw_socket(transport)
        self._stamped = raw if isinstance(raw, StampedSocket) else None
        self._arm()

    def _arm(self) -> None:
        if self._header_timeout > 0 and self._header_timer is None:
            self._header_timer = self.event_loop.call_later(self._header_timeout,
                                                            self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def data_received(self, data: bytes) -> None:
        stamped = self._stamped  # (its read of `data` has just stamped it: gateway.stamps)
        self.received_at = time.monotonic() if stamped is None else stamped.received_at
        if self._fast and self._answered_fast(data):
            return
        parsed = self.requests_parsed
        super().data_received(data)
        if self._backlog is not None:
            self._mark_arrivals(self.requests_parsed - parsed)
        if self.requests_parsed > parsed:
            self._disarm()  # a complete header block: the deadline is met
            if self.body_error_to_handler(HttpProcessingError):
                self.close()  # (the handler answers 400; then the connection goes)
        elif data and self._header_timer is None and self.between_requests():
            self._arm()  # the first bytes of a later request on a kept-alive connection

    def _mark_arrivals(self, new: int) -> None:
        """Mark this connection in the backlog once a generation request on it has been
        read whole: one whose headers and body came in this read, or whose body was
        awaited and is now in (a body still on its way is not an arrival yet)."""
        awaited = self._body_awaited
        if awaited is not None and awaited.is_eof():
            self._body_awaited = None
            self._backlog.mark(self, self.received_at)
        if not new:
            return
        for method, path, payload in self.last_parsed(new):
            if method == "POST" and path in self._arrival_paths:
                if payload.is_eof():
                    self._backlog.mark(self, self.received_at)
                else:
                    self._body_awaited = payload
                return

    def _answered_fast(self, data: bytes) -> bool:
        """A request answered without aiohttp's request, handler task and response objects
        (most of a /metrics scrape's CPU is theirs: see BENCHMARKS.md, "Replicas
        (fleet)"): only on a kept-alive HTTP/1.1 connection that is idle (aiohttp has
        served a request on it, holds no partial one and handles none) and whose output is
        flushed, for `data` that is exactly one complete request the app answers fast
        (FAST_GETS, FAST_POSTS). Anything else (and an answer of None) goes to aiohttp as
        it came."""
        if self._header_timer is not None or not self.idle():
            return False
        if data.startswith(b"GET /"):
            response = self._fast_get(data) if self._fast_gets is not None else None
        elif data.startswith(b"POST /"):
            response = self._fast_post(data) if self._fast_posts is not None else None
        else:
            return False
        if response is None:
            return False
        self.answered(response)
        return True

    def _fast_get(self, data: bytes):
        """A scrape: exactly one GET of a FAST_GETS path with no query, body or Connection
        header; its answer, or None."""
        if not data.endswith(b"\r\n\r\n"):
            return None
        line_end = data.find(b"\r\n")
        if data.find(b"\r\n\r\n") != len(data) - 4 or not data.endswith(b" HTTP/1.1", 0, line_end):
            return None
        answer = self._fast_gets.get(data[4:line_end - 9])
        if answer is None:
            return None
        head = data[line_end:].lower()
        if any(refused in head for refused in _FAST_REFUSED):
            return None
        request_id = None
        at = head.find(b"\r\nx-request-id:")
        if at >= 0:
            start = line_end + at + 15
            request_id = data[start:data.find(b"\r\n", start)].strip()
            if not request_id or not all(33 <= c < 127 for c in request_id):
                return None  # (aiohttp's own rules for anything unusual)
        return answer(request_id)  # its parts

    def _fast_post(self, data: bytes):
        """Exactly one POST of a FAST_POSTS path, HTTP/1.1, plain headers (each a token name
        and a visible-ASCII value, none twice, none of _POST_REFUSED, Connection only as
        keep-alive, which changes nothing in HTTP/1.1's answer, an x-request-id without
        whitespace) and a Content-Length body that is all the rest of `data`
        (pipelined or split requests are aiohttp's); the app's answer, or None."""
        line_end = data.find(b"\r\n")
        if line_end < 0 or not data.endswith(b" HTTP/1.1", 0, line_end):
            return None
        answer = self._fast_posts.get(data[5:line_end - 9])
        if answer is None:
            return None
        head_end = data.find(b"\r\n\r\n")
        if not 0 < head_end <= _POST_HEAD_MAX:
            return None
        block = data[line_end + 2:head_end + 2]
        if _HEADERS.fullmatch(block) is None:
            return None
        pairs = _HEADER.findall(block)
        headers = {name.lower(): value for name, value in pairs}
        if len(headers) != len(pairs) or not _POST_REFUSED.isdisjoint(headers):
            return None
        connection = headers.get(b"connection")  # (httpx, so the openai SDK, sends one)
        if connection is not None and connection.lower() != b"keep-alive":
            return None
        length = headers.get(b"content-length")
        body_at = head_end + 4
        if length is None or not length.isdigit() or int(length) != len(data) - body_at:
            return None
        request_id = headers.get(b"x-request-id")
        if request_id is not None and (b" " in request_id or b"\t" in request_id):
            return None
        return answer(headers, data[body_at:], self.received_at)

    def _headers_late(self) -> None:
        self._header_timer = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        log.info("closing a connection from %s: no complete request header within %.1f s",
                 transport.get_extra_info("peername"), self._header_timeout)
        body = envelope(408, f"Request header not received within {self._header_timeout:g} s.")
        transport.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
                        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        self.force_close()
        transport.close()

    # ---- the send deadline -----------------------------------------------------------------
    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timeout > 0 and self._send_timer is None:
            self._arm_send()

    def resume_writing(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        super().resume_writing()

    def _unsent(self) -> int:
        """Bytes written and not yet taken by the client: the transport's buffer and, where
        the host tells (Linux's SIOCOUTQ), the socket's send queue (it can hold megabytes,
        which a slow reader drains while the transport's buffer stays put)."""
        transport = self.transport
        if transport is None:
            return 0
        unsent = transport.get_write_buffer_size()
        sock = transport.get_extra_info("socket")
        if sock is not None and _OUTQ is not None:
            try:
                unsent += struct.unpack("i", fcntl.ioctl(sock.fileno(), _OUTQ, b"\0" * 4))[0]
            except OSError:
                pass
        return unsent

    def _arm_send(self) -> None:
        self._send_waiting = self._unsent()
        self._send_timer = self.event_loop.call_later(self._send_timeout, self._send_late)

    def _send_late(self) -> None:
        """The send timer: bytes left the buffer since it was armed (a slow reader) arm it
        again; none did (a reader that stopped) abort the connection, which ends its
        handler as a hang-up does (its engine requests are cancelled)."""
        self._send_timer = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self._unsent() < self._send_waiting:
            self._arm_send()
            return
        log.info("aborting a connection to %s: its client took no response bytes for %.1f s",
                 transport.get_extra_info("peername"), self._send_timeout)
        transport.abort()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        if self._backlog is not None:
            self._body_awaited = None
            self._backlog.clear(self)
        super().connection_lost(exc)

    # ---- refusals of the HTTP parser ------------------------------------------------------
    def handle_error(self, request: web.BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if self._backlog is not None:
            self._backlog.clear(self)  # (answered here, never sent)
        resp = super().handle_error(request, status, exc, message)  # logs; raises if sent
        reason = message or (exc.message if hasattr(exc, "message") else None) or resp.reason
        text = f"Bad HTTP request: {reason}" if status < 500 else "Internal server error."
        out = web.Response(status=status, body=envelope(status, text),
                           content_type="application/json")
        out.force_close()
        return out


def runner(app: web.Application, *, header_timeout: float = DEFAULT_HEADER_TIMEOUT_S,
           **kwargs) -> web.AppRunner:
    """The AppRunner serving `app` (aiohttp's `kwargs`): through EdgeRequestHandlers with
    the app's FAST_GETS, FAST_POSTS and ARRIVALS while the fast paths are on
    (gateway.aiohttp_gate), else aiohttp's own."""
    if not aiohttp_gate.fast_paths():
        return web.AppRunner(app, **kwargs)

    def connections(started: web.Application):
        arrivals = started.get(ARRIVALS)  # (after the app's start-up: its backlog exists)
        if arrivals is not None:
            paths, backlog = arrivals[0], arrivals[1]()
            arrivals = (paths, backlog) if backlog is not None else None
        return functools.partial(EdgeRequestHandler, header_timeout=header_timeout,
                                 send_timeout=SEND_TIMEOUT_S,
                                 fast=started.get(FAST_GETS) or None,
                                 fast_posts=started.get(FAST_POSTS) or None,
                                 arrivals=arrivals)

    return aiohttp_gate.ConnectionRunner(app, connections, **kwargs)
