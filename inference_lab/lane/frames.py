"""Length-prefixed frames on an asyncio transport (the Session lane's wire).

A frame is `HEADER` (a 4-byte big-endian length) followed by that many bytes. A length
above the receiver's `max_frame` is a protocol error: the connection is closed rather than
a buffer grown without bound. `FrameProtocol` hands every complete frame to `on_frame`
synchronously from `data_received` (several frames of one read in a row), and lets a
writer wait only when the transport pushes back (`drain`).
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable

HEADER = struct.Struct("!I")
# 64 MiB: the gateway's gRPC receive limit for the same messages (a ProgressBatch of
# thousands of streams is tens of KB; an Open with a long prompt's token IDs a few MB).
MAX_FRAME = 64 * 1024 * 1024
# The lane's flow control, like the gRPC Session's 1 KB HTTP/2 window: the writer keeps at
# most WINDOW bytes of frames unacknowledged by the reader, who acknowledges every
# WINDOW / 2 bytes once it has handled them (`acknowledge`). A reader that falls behind
# then makes the writer wait (so the engine merges each stream's tokens into fewer
# updates, and times the wait as the reader's lateness) instead of the kernel's socket
# buffers queueing tens of ms of batches. 512 bytes: every 256-stream batch (~800 bytes)
# waits for the gateway to have written the one before, while 24 streams' (~150 bytes)
# rarely wait; at 256 streams larger windows measured a higher TTFT overhead, and a small
# TCP window instead (SO_RCVBUF) a higher one still: TCP's window updates lag the reads
# (BENCHMARKS.md, "Session lane").
WINDOW = 512
WRITE_HIGH_WATER = 64 * 1024  # bytes queued in the transport before it pushes back


class FrameError(Exception):
    """The peer broke the framing (a length above the limit)."""


def frame(payload: bytes) -> bytes:
    """One frame: the length prefix and the payload."""
    return HEADER.pack(len(payload)) + payload


def _tune(transport: asyncio.BaseTransport) -> None:
    """TCP_NODELAY (a frame goes at once) and the transport's own buffer limit."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)


class FrameProtocol(asyncio.Protocol):
    """Parses frames as bytes arrive and calls `on_frame(payload)` for each, in order, in
    the same callback (`payload` is a memoryview: parse it before the callback returns,
    or keep it, never write to it); a subclass sets `on_frame` and overrides `lost` (the connection
    ended: None when cleanly, else the error). An oversize length calls `lost` with a
    FrameError and closes the transport."""

    max_frame = MAX_FRAME
    window: int | None = None  # the writer's flow-control window (None: none, the reader's)

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.on_frame: Callable[[bytes], None] = self._ignore
        self._buffer = bytearray()  # the start of a frame split across reads
        self._need = 0  # bytes the buffer must hold before it is parsed again
        self._paused = False
        self._drained: asyncio.Future[None] | None = None
        self._ended = False
        self.sent = 0  # bytes of frames written (length prefixes included)
        self.acked = 0  # of them, acknowledged by the reader
        self.received = 0  # bytes of frames read (length prefixes included)

    @staticmethod
    def _ignore(payload: bytes) -> None:
        pass

    # ---- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        _tune(transport)

    def data_received(self, data: bytes) -> None:
        # Frames are handed over as memoryview slices of the bytes read (no copy); only a
        # frame split across reads is gathered, and only once it is complete.
        buffer = self._buffer
        if buffer:
            buffer += data
            if len(buffer) < self._need:
                return
            data = bytes(buffer)
            buffer.clear()
        view = memoryview(data)
        size = HEADER.size
        start, end = 0, len(data)
        need = size
        while end - start >= size and not self._ended:
            (length,) = HEADER.unpack_from(data, start)
            if length > self.max_frame:
                self.fail(FrameError(f"frame of {length} bytes (limit {self.max_frame})"))
                return
            stop = start + size + length
            if stop > end:
                need = size + length
                break
            self.received += stop - start
            self.on_frame(view[start + size:stop])
            start = stop
        if start < end and not self._ended:
            buffer += view[start:]
            self._need = need

    def connection_lost(self, exc: Exception | None) -> None:
        ended, self._ended = self._ended, True
        self._wake_writer()
        if not ended:
            self.lost(exc)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_writer()

    # ---- for subclasses -----------------------------------------------------------------
    def lost(self, exc: Exception | None) -> None:
        """The connection ended (or was closed for a protocol error): override."""

    def write(self, payload: bytes) -> None:
        """Send one frame (buffered by the transport if the socket is full)."""
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(frame(payload))
            self.sent += HEADER.size + len(payload)

    def acknowledge(self, read: int) -> None:
        """The reader says it has read `read` bytes of our frames: the window moves."""
        if read > self.acked:
            self.acked = min(read, self.sent)
            if not self.pushing_back():
                self._wake_writer()

    def credit(self, size: int) -> None:
        """`size` bytes just written do not count against the window (bulk the reader
        need not acknowledge before more is written, e.g. a metrics copy in a batch)."""
        self.acked = min(self.acked + size, self.sent)

    def pushing_back(self) -> bool:
        """The transport is full, or the reader is a window behind."""
        window = self.window
        return self._paused or (window is not None and self.sent - self.acked >= window)

    async def drain(self) -> None:
        """Returns once more may be written (at once unless `pushing_back`);
        ConnectionError when the connection is gone."""
        while True:
            if self._ended:
                raise ConnectionResetError("the lane connection is closed")
            if not self.pushing_back():
                return
            waiter = self._drained
            if waiter is None or waiter.done():
                waiter = self._drained = asyncio.get_running_loop().create_future()
            await waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def fail(self, exc: Exception) -> None:
        """A protocol error: stop parsing, report it once, close the connection."""
        self._buffer.clear()
        ended, self._ended = self._ended, True
        self._wake_writer()
        if not ended:
            self.lost(exc)
        self.close()

    def _wake_writer(self) -> None:
        waiter = self._drained
        if waiter is not None and not waiter.done():
            if not self._ended:
                waiter.set_result(None)
            else:
                waiter.set_exception(ConnectionResetError("the lane connection is closed"))
        self._drained = None
