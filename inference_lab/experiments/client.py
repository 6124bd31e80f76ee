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

import msgspec

__all__ = ["Result", "Endpoint", "Connection", "ConnectionError_"]

TERMINATOR = b"\r\n0\r\n\r\n"  # the last chunk, after a chunk's data
TAIL_BYTES = 4096
_MODELLED = b'"inference_lab":'
_COMPLETION = re.compile(rb'"completion_tokens":\s*(\d+)')
_CACHED = re.compile(rb'"cached_tokens":\s*(\d+)')
_decoder = json.JSONDecoder()
_decode = msgspec.json.Decoder().decode
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
    replica: int = -1  # the replica the request went to (-1: none, or not a fleet)
    body: bytes = b""  # a 200's Content-Length body (a non-streaming answer), kept whole
    prefill_replica: int = -1  # a P/D request's prefill replica (-1: not P/D)
    prefill_done: float = 0.0  # ... when its prefill's answer came (time.monotonic())
    prefill_modelled: dict | None = None  # ... the prefill replica's "inference_lab" timings


class Endpoint:
    """Where requests go, and the request bytes for a prompt/output length pair (with
    `pooling`, an embeddings request of the prompt: a load of a pooling model)."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None,
                 pooling: bool = False) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"expected an http://HOST:PORT URL, got {base_url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.model = model
        self.pooling = pooling
        self._field = b'"input":"' if pooling else b'"prompt":"'
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
            entry = (raw, raw.index(self._field) + len(self._field))
            if len(self._cache) < 4096:
                self._cache[key] = entry
        raw, at = entry
        return raw[:at] + b64encode((serial & 0xFFFFFF).to_bytes(3, "little")) + raw[at + 4:]

    def build(self, prompt, max_tokens: int, serial: int) -> bytes:
        """The request bytes of an experiments.prompts.Prompt (its text, or filler of its
        length with `serial` as its first token)."""
        if prompt.text is None:
            return self.request(prompt.tokens, max_tokens, serial, prompt.adapter)
        return self.request_text(prompt.text, max_tokens, prompt.adapter)

    def request_text(self, prompt: str, max_tokens: int, model: str = "") -> bytes:
        """POST /v1/completions as `request`, with this prompt text (not cached); with
        `pooling`, POST /v1/embeddings of it (base64, as the OpenAI SDK asks)."""
        if self.pooling:
            path = "/v1/embeddings"
            body = json.dumps({"model": model or self.model, "input": prompt,
                               "encoding_format": "base64"}, separators=(",", ":")).encode()
        else:
            path = "/v1/completions"
            body = json.dumps({"model": model or self.model, "prompt": prompt,
                               "max_tokens": max_tokens, "stream": True,
                               "stream_options": {"include_usage": True}},
                              separators=(",", ":")).encode()
        return (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"{self._auth}Content-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    async def connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(lambda: Connection(loop), self.host, self.port)
        return conn


# Response states: the head is still coming; a chunked body; a Content-Length body; a
# body that ends when the server closes (neither).
HEAD, CHUNKED, LENGTH, UNTIL_CLOSE = range(4)


def parse_head(head: bytes) -> tuple[int, int, int, bool]:
    """(status, state, content_length, keep_alive) of a response head (without the
    blank line); raises ValueError for a head that is not HTTP/1.x."""
    if head[:7] != b"HTTP/1." or head[12:13] not in (b" ", b"\r", b""):
        raise ValueError("bad status line")
    status = int(head[9:12])
    lower = head.lower()
    keep_alive = b"\r\nconnection: close" not in lower and head[7:8] != b"0"
    if b"\r\ntransfer-encoding: chunked" in lower:
        return status, CHUNKED, -1, keep_alive
    i = lower.find(b"\r\ncontent-length:")
    if i < 0:
        return status, UNTIL_CLOSE, -1, False
    j = lower.find(b"\r\n", i + 17)
    try:
        length = int(lower[i + 17:j if j >= 0 else None])
    except ValueError:
        raise ValueError("bad Content-Length") from None
    return status, LENGTH, length, keep_alive


_heads: dict[bytes, tuple[int, int, int, bool]] = {}  # parse_head's answers: a server repeats its heads


def decode_modelled(tail: bytes) -> dict | None:
    """The "inference_lab" object (a flat one) from the last bytes of a response."""
    i = tail.rfind(_MODELLED)
    if i < 0:
        return None
    i += len(_MODELLED)
    j = tail.find(b"}", i)
    try:
        value = _decode(tail[i:j + 1])
    except msgspec.DecodeError:
        try:  # not flat after all
            value, _ = _decoder.raw_decode(tail[i:].decode("utf-8", "replace"))
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


class Connection(asyncio.Protocol):
    """One keep-alive connection, one request at a time.

    `conn.start(raw, on_done, ctx)` writes a request and calls `on_done(conn, result)` from
    `data_received` when the response has ended (or with status -1 when it failed, from
    `connection_lost` or a bad head): no future, task or callback hop per request, for the
    open loop. `await conn.send(raw)` is the same as an awaitable (raises ConnectionError_).
    `ctx` is the caller's, carried with the request.

    Framing: the head up to CRLF CRLF (status, Content-Length, Transfer-Encoding: chunked,
    Connection: close); a Content-Length body is counted; a chunked body ends at its last
    chunk, CRLF "0" CRLF CRLF, recognised as the stream's suffix (SSE frames are JSON lines,
    which never hold a raw CR LF: only the chunk framing does); a body with neither ends
    when the server closes. Of a stream only the last TAIL_BYTES or so are kept (usage and the modelled
    timings come in the stream's last frames).
    """

    __slots__ = ("loop", "transport", "on_done", "ctx", "result", "head", "state", "length",
                 "got", "pieces", "kept", "closed", "keep_alive")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport = None
        self.on_done = None  # on_done(conn, result) while a request is out
        self.ctx = None
        self.result: Result | None = None
        self.closed = False
        self.keep_alive = True
        self.head = b""
        self.state = HEAD
        self.length = -1
        self.got = 0
        self.pieces: list[bytes] = []
        self.kept = 0

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.result is None:
            return
        if self.state == UNTIL_CLOSE:
            self._finish()
        else:
            self._fail(str(exc) if exc else "connection closed")

    def start(self, raw: bytes, on_done, ctx=None) -> None:
        """Write one request; `on_done(self, result)` gets its Result."""
        if self.closed or self.result is not None:
            raise ConnectionError_("connection closed" if self.closed else "a request is out")
        self.state = HEAD
        self.got = self.kept = 0
        self.pieces = []
        self.on_done = on_done
        self.ctx = ctx
        self.result = Result(0, monotonic(), 0.0, 0.0)
        self.transport.write(raw)

    def send(self, raw: bytes) -> asyncio.Future:
        """Write one request; the future gets its Result (or ConnectionError_)."""
        waiter = self.loop.create_future()
        self.start(raw, _resolve, waiter)
        return waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        result = self.result
        if result is None:
            return  # nothing asked for: bytes after a response (a broken server)
        state = self.state
        if state == HEAD:
            if self.head:
                data = self.head + data
            end = data.find(b"\r\n\r\n")
            if end < 0:
                self.head = data
                return
            self.head = b""
            head, data = data[:end], data[end + 4:]
            parsed = _heads.get(head)
            if parsed is None:
                try:
                    parsed = parse_head(head)
                except ValueError as exc:
                    self._fail(str(exc))
                    return
                if len(_heads) >= 256:
                    _heads.clear()
                _heads[head] = parsed
            result.status, state, self.length, self.keep_alive = parsed
            self.state = state
            if state == LENGTH and self.length == 0:
                self._finish()
                return
            if not data:
                return
        n = len(data)
        self.got += n
        self.pieces.append(data)
        self.kept += n
        if self.kept > 2 * TAIL_BYTES and state != LENGTH:  # (a Content-Length body is kept whole)
            tail = b"".join(self.pieces)[-TAIL_BYTES:]
            self.pieces = [tail]
            self.kept = len(tail)
        if state == CHUNKED:
            if not result.first and b"data: " in data:
                result.first = monotonic()
            if data.endswith(TERMINATOR):
                self._finish()
            elif n < 7 or self.got == 5:  # the terminator split over reads; or no chunks
                end = b"".join(self.pieces[-7:])[-7:]
                if end == TERMINATOR or (self.got == 5 and end == b"0\r\n\r\n"):
                    self._finish()
        elif state == LENGTH and self.got >= self.length:
            self._finish()

    def _finish(self) -> None:
        result, on_done = self.result, self.on_done
        self.result = None
        result.done = monotonic()
        pieces = self.pieces
        tail = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        self.pieces = []
        if result.status == 200:
            i = tail.rfind(b'"completion_tokens"')
            if i >= 0:
                m = _COMPLETION.match(tail, i)
                if m is not None:
                    result.completion_tokens = int(m.group(1))
            i = tail.rfind(b'"cached_tokens"')
            if i >= 0:
                m = _CACHED.match(tail, i)
                if m is not None:
                    result.cached_tokens = int(m.group(1))
            result.modelled = decode_modelled(tail)
            if self.state == LENGTH:
                result.body = tail
        else:
            result.error = tail[:300].decode("utf-8", "replace")
        if not self.keep_alive:
            self.close()
        on_done(self, result)

    def _fail(self, why: str) -> None:
        result, on_done = self.result, self.on_done
        self.result = None
        self.pieces = []
        self.close()
        if result is not None:
            result.status = -1
            result.done = monotonic()
            result.error = why[:300]
            on_done(self, result)


def _resolve(conn: Connection, result: Result) -> None:
    waiter = conn.ctx
    if waiter.done():
        return
    if result.status == -1:
        waiter.set_exception(ConnectionError_(result.error))
    else:
        waiter.set_result(result)
