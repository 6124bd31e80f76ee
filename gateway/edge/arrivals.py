"""When a request arrived, and the backlog's marks of the generation requests read.

Knows: `received_at`, the time.monotonic() of a connection's latest bytes: the kernel's
receive instant where the listener gives it (gateway.stamps), else the read's; which
`arrival_stamp` turns into a request's arrival instant (inference_lab.common.clock). And
the app's generation routes with its backlog (`ARRIVALS`, gateway.backlog): a POST of one
of them is marked from the moment its last bytes are read (its headers and body in one
read, or the awaited body once it is in: a body still on its way is not an arrival yet)
until the app releases it (sent or answered: gateway.backlog `Hold`) or the connection
releases it (`Marks.release`: the connection went, or aiohttp's parser refused a request
on it).

Does not know: HTTP answers, routes' handlers, the engine.
"""

from __future__ import annotations

import time

from aiohttp import web

from inference_lab.gateway.backlog import Backlog
from inference_lab.gateway.stamps import StampedSocket

# The app's generation routes and its backlog of them (gateway.backlog), as a callable run
# once the app has started: every POST of one of these paths is marked in the backlog
# from the moment its last bytes are read until the app clears it (sent or answered).
ARRIVALS = web.AppKey("arrivals", tuple)


def arrival_stamp(request: web.BaseRequest) -> float:
    """When the gateway finished reading `request` (time.monotonic()), for a caller whose
    body is read: the arrival of the connection's latest bytes, the body's last (later
    bytes, a pipelined next request, only make it later). Under a server that is not
    the edge's: now."""
    stamp = getattr(request.protocol, "received_at", None)
    return time.monotonic() if stamp is None else stamp


def received_now(stamped: StampedSocket | None) -> float:
    """The instant of the bytes just read: the kernel's stamp of its read of them
    (gateway.stamps), else now."""
    return time.monotonic() if stamped is None else stamped.received_at


class Marks:
    """One connection's mark in the backlog (the connection is the key) for the
    generation requests read on it."""

    __slots__ = ("_connection", "_backlog", "_paths", "_body_awaited")

    def __init__(self, connection: object, paths: frozenset, backlog: Backlog) -> None:
        self._connection = connection
        self._backlog = backlog
        self._paths = paths
        self._body_awaited = None  # a marked route's body still on its way (its payload)

    def parsed(self, new, stamp: float) -> None:
        """The connection has read to `stamp`, and aiohttp parsed the requests `new`
        ((method, path, body stream), the latest last): mark it once a generation request
        has been read whole, one whose headers and body came in this read, or whose body
        was awaited and is now in."""
        awaited = self._body_awaited
        if awaited is not None and awaited.is_eof():
            self._body_awaited = None
            self._backlog.mark(self._connection, stamp)
        for method, path, payload in new:
            if method == "POST" and path in self._paths:
                if payload.is_eof():
                    self._backlog.mark(self._connection, stamp)
                else:
                    self._body_awaited = payload
                return

    def release(self, gone: bool = False) -> None:
        """The connection's release of its mark: a request on it was refused before it
        reached the app, or (`gone`) the connection went, with any body still awaited."""
        if gone:
            self._body_awaited = None
        self._backlog.clear(self._connection)
