"""aiohttp's private state, behind one gate: the only module of the gateway that reads or
writes it.

Knows: the aiohttp releases the gateway's fast paths were tested on (`TESTED`, the range
pyproject.toml declares), and for them the private state those paths use:
- `GateRequestHandler`: aiohttp's connection protocol (web.RequestHandler) with the state
  the edge reads named (requests parsed, the messages queued, whether it is idle between
  requests, the keep-alive deadline, a parse error queued behind a body), and
  `ConnectionRunner`, an AppRunner whose connections are made by the caller's factory
  (gateway.edge);
- the relay's writes (gateway.protocols.generate): `write_now` drives a response's write
  without awaiting, `direct_chunks` / `write_chunk` write a body chunk straight to the
  transport, keeping the response writer's byte counts as its own writes keep them
  (`bytes_written` reads them);
- the head aiohttp writes on a response (`SERVER_SOFTWARE`, `http_date`, `response_head`),
  which the edge's answers copy byte for byte;
- `HttpProcessingError`: what aiohttp's HTTP parser raises (gateway.edge `read_body`
  catches it inside a body);
- `raw_socket`: the socket under an asyncio transport (asyncio's TransportSocket wraps it),
  which receive stamps read through (gateway.stamps).

`fast_paths()` decides once, when the gateway starts: on when the installed aiohttp is in
`TESTED` and has the state named here, and INFERENCE_LAB_FAST_PATHS is not "0" / "off";
otherwise one log line says why, and the gateway serves through aiohttp's public API only
(web.AppRunner and a TCPSite, every write through StreamResponse.write): the same routes,
answers and envelopes (529s and refusals included), streams and cancellations; without
the edge's answers on kept-alive connections, the relay's writes from the Session
dispatcher, kernel receive stamps (a request arrives when its handler reads it) and the
backlog's hold; malformed HTTP gets aiohttp's own plain-text answers and no header-read
deadline applies (aiohttp's keep-alive timeout does).

Does not know: routes, HTTP answers, backlogs or the engine (gateway.edge, gateway.app).
"""

from __future__ import annotations

import email.utils
import logging
import os
import platform
import re
from collections.abc import Callable, Iterator

import aiohttp
from aiohttp import web

log = logging.getLogger("inference_lab.gateway.aiohttp_gate")

# The releases the fast paths were tested on: [first, first not tested). pyproject.toml
# declares the same range (a test checks that they agree); CI runs the gateway's tests at
# both ends. 3.13.4 is the first to refuse a request of more than 128 headers (the edge's
# envelope for it is tested).
TESTED = ((3, 13, 4), (3, 15))
ENV = "INFERENCE_LAB_FAST_PATHS"  # "0" or "off": every fast path off, whatever the version
_OFF = frozenset(("0", "off", "false", "no"))

try:  # (internal modules: an aiohttp without them gets the public paths and these stand-ins)
    from aiohttp.helpers import rfc822_formatted_time as _http_date
    from aiohttp.http import SERVER_SOFTWARE, HttpProcessingError
    from aiohttp.http_writer import StreamWriter
    _IMPORTED = True
except ImportError:  # pragma: no cover (an aiohttp outside the tested range)
    StreamWriter = None

    class HttpProcessingError(Exception):  # (what aiohttp's parser raises: never, here)
        message = ""

    SERVER_SOFTWARE = f"Python/{platform.python_version()} aiohttp/{aiohttp.__version__}"
    _IMPORTED = False

    def _http_date() -> str:
        return email.utils.formatdate(usegmt=True)

# what `GateRequestHandler` reads and writes of aiohttp's connection protocol, and the relay of a
# response (each a slot or attribute of the class in the tested releases)
_CONNECTION_STATE = ("_request_count", "_messages", "_current_request", "_payload_parser",
                     "_force_close", "_waiter", "_keepalive_timeout",
                     "_next_keepalive_close_time", "_loop", "writing_paused")
_RESPONSE_STATE = ("_payload_writer", "_eof_sent")


def _release(version: str) -> tuple[int, ...] | None:
    """(3, 14, 5) of "3.14.5" (a pre-release counts as its release: "3.15.0a1" is 3.15.0)."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        return None
    return tuple(int(part) for part in match.groups(default="0"))


def _missing_state() -> list[str]:
    if not _IMPORTED:
        return ["aiohttp.helpers / aiohttp.http / aiohttp.http_writer names"]
    return ([name for name in _CONNECTION_STATE if not hasattr(web.RequestHandler, name)]
            + [name for name in _RESPONSE_STATE if not hasattr(web.StreamResponse, name)])


def tested_range() -> str:
    """The tested range as pyproject.toml writes it: ">=3.13.4,<3.15"."""
    return ">=%s,<%s" % (".".join(map(str, TESTED[0])), ".".join(map(str, TESTED[1])))


def why_off(version: str, setting: str | None, missing: list[str] | None = None) -> str | None:
    """Why the fast paths are off with aiohttp `version` and INFERENCE_LAB_FAST_PATHS
    `setting` (None: unset), given the private state `missing` from aiohttp; None: on."""
    if setting is not None and setting.strip().lower() in _OFF:
        return f"{ENV}={setting}"
    release = _release(version)
    if release is None or not TESTED[0] <= release < TESTED[1]:
        return f"aiohttp {version} is outside the range they were tested on ({tested_range()})"
    if missing:
        return f"aiohttp {version} lacks {', '.join(missing)}"
    return None


_decided: bool | None = None


def fast_paths() -> bool:
    """Whether the gateway's fast paths are on (decided at the first call, the gateway's
    start; an off is logged once)."""
    global _decided
    if _decided is None:
        reason = why_off(aiohttp.__version__, os.environ.get(ENV), _missing_state())
        _decided = reason is None
        if reason is not None:
            log.warning("aiohttp fast paths off (%s): serving through aiohttp's public API "
                        "only", reason)
    return _decided


def decide_again() -> bool:
    """`fast_paths()` decided afresh (its environment changed: tests)."""
    global _decided
    _decided = None
    return fast_paths()


# ---- the head aiohttp writes ---------------------------------------------------------------


def http_date() -> str:
    """The Date header's value as aiohttp writes it (its per-second cache)."""
    return _http_date()


def response_head(status: int, content_type: bytes, first: bytes = b"", last: bytes = b"") -> bytes:
    """A response head as aiohttp writes one on a kept-alive HTTP/1.1 connection (its
    reason phrase for `status`, its header order) with a body's length, Date and
    x-request-id left as the three `%` slots (%d, %s, %s) of the returned bytes. `first`
    and `last`: header lines (each ending in CRLF, `%` slots of their own kept as they are)
    before Content-Type and after x-request-id, where aiohttp puts the headers a handler
    set before and after its own."""
    reason = web.Response(status=status).reason or ""
    fixed = b"HTTP/1.1 %d %s\r\n" % (status, reason.encode())
    server = SERVER_SOFTWARE.encode().replace(b"%", b"%%")
    return (fixed.replace(b"%", b"%%") + first + b"Content-Type: "
            + content_type.replace(b"%", b"%%") + b"\r\nContent-Length: %d\r\nDate: %s\r\nServer: "
            + server + b"\r\nx-request-id: %s\r\n" + last + b"\r\n")


# ---- the connection ------------------------------------------------------------------------


class GateRequestHandler(web.RequestHandler):
    """aiohttp's connection protocol with the state the edge reads named. Served only by
    a `ConnectionRunner`, which is only made while `fast_paths()`."""

    __slots__ = ()

    @property
    def requests_parsed(self) -> int:
        """How many request heads aiohttp has parsed on this connection."""
        return self._request_count

    @property
    def event_loop(self):
        return self._loop

    def between_requests(self) -> bool:
        """aiohttp waits for the next request: none is in hand, queued or partly read."""
        return self._payload_parser is None and not self._messages and self._waiter is not None

    def idle(self) -> bool:
        """Kept alive and idle: aiohttp has served a request here, holds no partial one
        and handles none, and the output is flushed (a client that does not read gets
        aiohttp's handler, which waits for the drain)."""
        transport = self.transport
        return bool(self._request_count and not self._messages
                    and self._current_request is None and self._payload_parser is None
                    and not self._force_close and self._waiter is not None
                    and transport is not None and not transport.get_write_buffer_size())

    def last_parsed(self, count: int) -> Iterator[tuple[str | None, str, object]]:
        """(method, path, body stream) of the last `count` requests parsed (a parse
        error queued among them has no method)."""
        messages = self._messages
        for i in range(max(len(messages) - count, 0), len(messages)):
            message, payload = messages[i]
            yield getattr(message, "method", None), getattr(message, "path", ""), payload

    def answered(self, parts) -> None:
        """`parts` (a whole response) written as one answer of this connection, which
        stays kept alive for aiohttp's keep-alive timeout from now."""
        self.transport.writelines(parts)
        self._next_keepalive_close_time = self._loop.time() + self._keepalive_timeout

    def body_error_to_handler(self, error_type: type[BaseException]) -> bool:
        """aiohttp queues a parse error of a body it is still receiving (bad chunked
        framing) as the next message while the handler waits for the body: hand it to
        that body instead (True when there was one)."""
        request = self._current_request
        if request is None or not self._messages:
            return False
        message, _ = self._messages[-1]
        exc = getattr(message, "exc", None)
        if not isinstance(exc, error_type):
            return False
        self._messages.pop()
        request.content.set_exception(exc)
        return True


class _Server(web.Server):
    """aiohttp's low-level server whose connections come from `connection`."""

    connection: Callable[..., GateRequestHandler] | None = None

    def __call__(self) -> web.RequestHandler:
        return self.connection(self, loop=self._loop, **self._kwargs)


class ConnectionRunner(web.AppRunner):
    """An AppRunner whose connections are made by `connections(app)`, a factory of
    `GateRequestHandler`s taking aiohttp's arguments, asked once the app has started (what its
    start-up sets is there)."""

    def __init__(self, app: web.Application,
                 connections: Callable[[web.Application], Callable[..., GateRequestHandler]],
                 **kwargs) -> None:
        super().__init__(app, **kwargs)
        self._connections = connections

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _Server  # the same object, whose factory makes our connections
        server.connection = self._connections(self.app)
        return server


# ---- the relay's writes ----------------------------------------------------------------------


def write_now(resp: web.StreamResponse, data: bytes) -> bool:
    """`resp.write(data)` driven without awaiting: True when it completed (aiohttp wrote
    to the transport, which did not push back); False when it had to wait for a drain
    (the bytes are written; the caller's next awaited write drains). Raises its error."""
    write = resp.write(data)
    try:
        write.send(None)
    except StopIteration:
        return True
    write.close()
    return False


def direct_chunks(resp: web.StreamResponse):
    """`resp`'s payload writer when a body chunk may be written to the transport without
    it (saving the writer's coroutine and framing calls per write): its headers are out,
    the body is chunked, uncompressed, unbounded and nobody listens to its writes; else None."""
    writer = getattr(resp, "_payload_writer", None)
    if (StreamWriter is None or type(writer) is not StreamWriter
            or not getattr(writer, "chunked", False)
            or getattr(writer, "_compress", 0) is not None or getattr(writer, "length", 0) is not None
            or getattr(writer, "_on_chunk_sent", 0) is not None
            or getattr(writer, "on_body_write", None) is not None  # (3.14's listener)
            or getattr(writer, "_headers_buf", 0) is not None or getattr(resp, "_eof_sent", True)
            or not isinstance(getattr(writer, "output_size", None), int)
            or not isinstance(getattr(writer, "buffer_size", None), int)):
        return None
    return writer


def bytes_written(resp: web.StreamResponse) -> int:
    """The bytes `resp`'s payload writer counts as written (headers and framing included;
    `write_chunk`'s writes too), as aiohttp's access log counts them."""
    return resp._payload_writer.output_size


def write_chunk(writer, transport, data: bytes) -> bool:
    """`data` as one HTTP chunk of `writer`'s body, straight to `transport` (counted as
    the writer counts its own); False, nothing written, when the transport is closing."""
    if transport.is_closing():
        return False
    chunk = b"%x\r\n%b\r\n" % (len(data), data)
    writer.output_size += len(chunk)
    writer.buffer_size += len(chunk)
    transport.write(chunk)
    return True


# ---- the socket under a transport ----------------------------------------------------------


def raw_socket(transport):
    """The socket object an asyncio transport reads through (None under uvloop, or
    without a transport)."""
    wrapper = transport.get_extra_info("socket") if transport is not None else None
    return getattr(wrapper, "_sock", None)
