"""A lean HTTP/1.1 client for the experiment's requests: one keep-alive connection per
asyncio Protocol, pre-built request bytes, a response parsed only as far as the records
need it (status, the arrival of the first SSE frame, the end of the chunked body, and
the usage and modelled timings from the stream's last bytes).

Why not aiohttp: the load generator must cost a few tens of CPU-microseconds per request
at 1,000 requests/s (BENCHMARKS.md), and a general client's request and response objects
cost several times that. The server is this project's gateway, whose responses are
either a Content-Length body (errors, 529s) or a chunked SSE stream.

Knows: HTTP/1.1 framing and the OpenAI streaming response's shape. Does not know the
controllers or the scenario.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from base64 import b64encode
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["Result", "Endpoint", "Connection", "ConnectionError_"]

TERMINATOR = b"\r\n0\r\n\r\n"
TAIL_BYTES = 4096
_MODELLED = b'"inference_lab":'
_COMPLETION = re.compile(rb'"completion_tokens":(\d+)')
_CACHED = re.compile(rb'"cached_tokens":(\d+)')
_decoder = json.JSONDecoder()
# The clock of every timestamp: uvloop's loop.time() counts whole milliseconds.
monotonic = time.monotonic


class ConnectionError_(Exception):
    """The connection failed or closed before a whole response came."""


@dataclass(slots=True)
class Result:
    status: int  # HTTP status; -1 = no response (connection failed)
    sent: float  # time.monotonic() when the request was written
    first: float  # ... of the first SSE frame (0 when none)
    done: float  # ... when the response ended
    completion_tokens: int = 0
    modelled: dict | None = None  # the engine's "inference_lab" timings
    error: str = ""
    cached_tokens: int = -1  # usage.prompt_tokens_details.cached_tokens; -1 if absent


class Endpoint:
    """Where requests go, and the request bytes for a prompt/output length pair."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"expected an http://HOST:PORT URL, got {base_url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.model = model
        self._auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
        self._cache: dict[tuple[int, int, str], tuple[bytes, int]] = {}

    def request(self, prompt_tokens: int, max_tokens: int, serial: int = 0, model: str = "") -> bytes:
        """POST /v1/completions, streaming with usage: a prompt of exactly `prompt_tokens`
        tokens (the gateway counts ceil(bytes / 4)) whose first token is `serial` in 4
        base64 characters, so that requests share no cached prefix; `max_tokens` to
        generate; `model` (default: the endpoint's). The rest is cached per length."""
        key = (prompt_tokens, max_tokens, model)
        entry = self._cache.get(key)
        if entry is None:
            raw = self.request_text("abcd" * prompt_tokens, max_tokens, model)
            entry = (raw, raw.index(b'"prompt":"') + 10)
            if len(self._cache) < 4096:
                self._cache[key] = entry
        raw, at = entry
        return raw[:at] + b64encode((serial & 0xFFFFFF).to_bytes(3, "little")) + raw[at + 4:]

    def request_text(self, prompt: str, max_tokens: int, model: str = "") -> bytes:
        """POST /v1/completions as `request`, with this prompt text (not cached)."""
        body = json.dumps({"model": model or self.model, "prompt": prompt,
                           "max_tokens": max_tokens, "stream": True,
                           "stream_options": {"include_usage": True}},
                          separators=(",", ":")).encode()
        return (f"POST /v1/completions HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"{self._auth}Content-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    async def connect(self) -> "Connection":
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(lambda: Connection(loop), self.host, self.port)
        return conn


class Connection(asyncio.Protocol):
    """One keep-alive connection, one request at a time: `await conn.send(raw)`."""

    __slots__ = ("loop", "transport", "waiter", "result", "head", "length", "chunked",
                 "got", "tail", "closed")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport = None
        self.waiter: asyncio.Future | None = None
        self.result: Result | None = None
        self.closed = False
        self._reset()

    def _reset(self) -> None:
        self.head = b""
        self.length = -1  # Content-Length, once the head is in; -1 before
        self.chunked = False
        self.got = 0
        self.tail = b""

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionError_(str(exc) if exc else "connection closed"))

    def send(self, raw: bytes) -> asyncio.Future:
        """Write one request; the future gets its Result."""
        if self.closed:
            raise ConnectionError_("connection closed")
        self._reset()
        now = monotonic()
        self.result = Result(0, now, 0.0, 0.0)
        self.waiter = self.loop.create_future()
        self.transport.write(raw)
        return self.waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        result = self.result
        if result is None or self.waiter is None:
            return
        if self.length < 0 and not self.chunked:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data = self.head[:end], self.head[end + 4:]
            try:
                result.status = int(head[9:12])
            except ValueError:
                self._fail("bad status line")
                return
            lower = head.lower()
            if b"transfer-encoding: chunked" in lower:
                self.chunked = True
            else:
                i = lower.find(b"content-length:")
                if i < 0:
                    self._fail("no Content-Length")
                    return
                j = lower.find(b"\r\n", i)
                self.length = int(lower[i + 15:j if j >= 0 else None])
        if not data:
            if self.length == 0:
                self._finish()
            return
        if self.chunked:
            if not result.first and b"data: " in data:
                result.first = monotonic()
            tail = self.tail + data
            self.tail = tail[-TAIL_BYTES:]
            if tail.endswith(TERMINATOR) or tail == b"0\r\n\r\n":
                self._finish()
        else:
            self.got += len(data)
            self.tail = (self.tail + data)[-TAIL_BYTES:]
            if self.got >= self.length:
                self._finish()

    def _finish(self) -> None:
        result, waiter = self.result, self.waiter
        self.result = self.waiter = None
        result.done = monotonic()
        tail = self.tail
        if result.status == 200:
            m = None
            for m in _COMPLETION.finditer(tail):
                pass
            if m is not None:
                result.completion_tokens = int(m.group(1))
            m = None
            for m in _CACHED.finditer(tail):
                pass
            if m is not None:
                result.cached_tokens = int(m.group(1))
            i = tail.rfind(_MODELLED)
            if i >= 0:
                try:
                    result.modelled, _ = _decoder.raw_decode(tail[i + len(_MODELLED):].decode("utf-8", "replace"))
                except ValueError:
                    pass
        else:
            result.error = tail[:300].decode("utf-8", "replace")
        if not waiter.done():
            waiter.set_result(result)

    def _fail(self, why: str) -> None:
        waiter = self.waiter
        self.result = self.waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionError_(why))
        self.close()
