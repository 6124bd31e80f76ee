"""The kernel's receive instant of a connection's bytes, as a request's arrival.

Knows: how to listen on a TCP socket whose accepted connections read with `recvmsg` and
the kernel's software receive timestamp (SO_TIMESTAMPNS, Linux): each read leaves on the
socket, in `received_at`, the instant (time.monotonic()) at which the latest bytes it
returned reached this machine's TCP stack. A request's arrival is then its last bytes'
arrival, not the later instant at which a busy gateway got round to reading them: on a
2-core machine the gateway often reads a request a few hundred microseconds after it came
(relaying a step's tokens, or waiting for a core), and that delay is the lab's, not the
modelled server's (docs/benchmarks.md, "TTFT breakdown"). The engine books the arrival at the
stamp, never earlier than its clock can honour (engine.drivers.pacer `arrival_of`).

Where the timestamp cannot be had (not Linux, an option the kernel refuses, an event loop
that does not read through the socket object, such as uvloop), `received_at` stays None
and the edge stamps the read instead (gateway.edge): the same behaviour as before, never
an error.

Does not know: HTTP (gateway.edge), routes (gateway.app), or how to find the socket under a
transport (gateway.aiohttp_gate `raw_socket`, the edge's).
"""

from __future__ import annotations

import logging
import socket
import struct
import sys
import time

log = logging.getLogger("inference_lab.gateway.stamps")

# SO_TIMESTAMPNS (asm-generic; Python's socket module does not name it) and the struct
# timespec it delivers as SCM_TIMESTAMPNS: two native longs.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("@ll")
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0
# A stamp older than this is not trusted (the wall clock stepped between the kernel's
# reading and ours): the read instant is used instead.
MAX_AGE_NS = 1_000_000_000
SUPPORTED = sys.platform.startswith("linux") and _ANCILLARY > 0


class StampedSocket(socket.socket):
    """An accepted connection that reads with its kernel receive timestamp."""

    __slots__ = ("received_at",)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data, ancillary, _, _ = self.recvmsg(bufsize, _ANCILLARY, flags)
        wall = time.time_ns()  # (the stamp is on this clock: its age, read next to now)
        now = time.monotonic()
        for level, kind, raw in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= _TIMESPEC.size:
                seconds, nanos = _TIMESPEC.unpack_from(raw)
                age = wall - (seconds * 1_000_000_000 + nanos)
                if 0 <= age < MAX_AGE_NS:
                    now -= age * 1e-9
        self.received_at = now
        return data

    def recv_into(self, buffer, nbytes: int = 0, flags: int = 0) -> int:
        # (asyncio reads a BufferedProtocol's connection this way; aiohttp's is not one)
        count = super().recv_into(buffer, nbytes, flags)
        self.received_at = time.monotonic()
        return count


class StampingListener(socket.socket):
    """A listening socket whose accepted connections are StampedSockets with receive
    timestamps on."""

    __slots__ = ()

    def accept(self) -> tuple[StampedSocket, object]:
        fd, address = self._accept()
        conn = StampedSocket(self.family, self.type, self.proto, fileno=fd)
        conn.received_at = None
        try:
            conn.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:  # (then recvmsg delivers no stamp: the read instant is used)
            pass
        if socket.getdefaulttimeout() is None and self.gettimeout():
            conn.setblocking(True)  # (as socket.accept does)
        return conn, address


def listen(host: str, port: int, backlog: int = 128,
           reuse_port: bool = False) -> socket.socket | None:
    """A bound, listening, non-blocking StampingListener for `host`:`port`, or None when
    receive stamps are not supported here or `host` names more than one address (then
    the caller listens its usual way). `reuse_port`: SO_REUSEPORT, so that several
    processes (API servers) share the port and the kernel spreads connections over them."""
    if not SUPPORTED:
        return None
    infos = {(family, address) for family, _, _, _, address in socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)}
    if len(infos) != 1:
        return None
    (family, address), = infos
    sock = StampingListener(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as asyncio's servers)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:  # (on the listener too: bytes that arrive before accept are stamped as well)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            return _plain(sock)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _plain(sock: socket.socket) -> None:
    log.debug("no kernel receive timestamps here: arrivals are stamped when read")
    sock.close()
    return None
