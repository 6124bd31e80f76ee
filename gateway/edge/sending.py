"""How long a client may take to read: the send deadline under back-pressure.

Knows: once the client's socket pushes back (asyncio pauses the connection's writing),
the bytes waiting for it must shrink within SEND_TIMEOUT_S, and again each SEND_TIMEOUT_S
until writing resumes; a client that stops reading has its connection aborted, which ends
the response's handler as a hang-up does (its engine requests are cancelled; aiohttp
alone would wait on the drain for ever, holding the response's bytes). The bytes waiting
are the transport's buffer and, where the host tells (Linux's SIOCOUTQ), the socket's send
queue (it can hold megabytes, which a slow reader drains while the transport's buffer stays
put).

Does not know: what is written, HTTP, routes.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import sys

log = logging.getLogger("inference_lab.gateway.edge")

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


class SendDeadline:
    """A connection's send deadline: `paused` when asyncio pauses its writing, `resumed`
    when it resumes, `stop` when the connection goes."""

    __slots__ = ("_connection", "timeout", "_timer", "_waiting")

    def __init__(self, protocol: asyncio.BaseProtocol, timeout: float | None) -> None:
        self._connection = protocol  # (the edge's connection: its transport)
        self.timeout = SEND_TIMEOUT_S if timeout is None else timeout
        self._timer: asyncio.TimerHandle | None = None
        self._waiting = 0  # bytes the transport held when the timer was armed

    def paused(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.timeout > 0 and self._timer is None:
            self._arm(loop)

    def resumed(self) -> None:
        self.stop()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _unsent(self) -> int:
        """Bytes written and not yet taken by the client."""
        transport = self._connection.transport
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

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        self._waiting = self._unsent()
        self._timer = loop.call_later(self.timeout, self._late, loop)

    def _late(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bytes left since the timer was armed (a slow reader) arm it again; none did (a
        reader that stopped) abort the connection, which ends its handler as a hang-up
        does."""
        self._timer = None
        transport = self._connection.transport
        if transport is None or transport.is_closing():
            return
        if self._unsent() < self._waiting:
            self._arm(loop)
            return
        log.info("aborting a connection to %s: its client took no response bytes for %.1f s",
                 transport.get_extra_info("peername"), self.timeout)
        transport.abort()
