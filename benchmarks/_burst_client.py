"""The client side of `burst.py`: N streaming requests written at once, each read to its end.

    python benchmarks/_burst_client.py '<json config>'   # writes its JSON result to config["out"]

Raw asyncio Protocols on uvloop (one process). Config: host, port, path, body (the JSON
request), n, mode ("new": each request on a connection opened for it; "kept": on a
connection that has already served a GET /health, so the server treats it as an idle
kept-alive connection), t0 (time.monotonic() at which to start writing), t_hard (give up).

Per request it records the instant its bytes were written (time.monotonic() right after
`transport.write`, which on loopback is within microseconds of the kernel's receive
instant), the status, the instant of the response's first byte and of its first token
event, and whether the stream ended whole: the final chunk (`[DONE]`) after a usage frame
whose completion_tokens equals max_tokens. The response body is not decoded beyond that.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

monotonic = time.monotonic
TOKEN = b'"content":"'  # (chat chunks carrying generated text)
USAGE = b'"completion_tokens":'
DONE = b"data: [DONE]"


class Conn(asyncio.Protocol):
    __slots__ = ("transport", "opened", "warm", "head", "status", "t_write", "t_first_byte",
                 "t_first_token", "tail", "done", "closed", "ended")

    def __init__(self) -> None:
        self.transport = None
        self.opened = asyncio.get_running_loop().create_future()
        self.warm: asyncio.Future | None = None  # the GET /health answered
        self.head = b""
        self.status = 0
        self.t_write = 0.0
        self.t_first_byte = 0.0
        self.t_first_token = 0.0
        self.tail = b""
        self.done = asyncio.get_running_loop().create_future()
        self.closed = False
        self.ended = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        if not self.opened.done():
            self.opened.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.warm is not None and not self.warm.done():
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end >= 0:
                length = 0
                for line in self.head[:end].split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if len(self.head) >= end + 4 + length:
                    self.head = b""
                    self.warm.set_result(None)
            return
        now = monotonic()
        if not self.t_first_byte:
            self.t_first_byte = now
            self.head = data
            try:
                self.status = int(data[9:12])
            except ValueError:
                self.status = -1
        if not self.t_first_token and TOKEN in data:
            self.t_first_token = now
        self.tail = (self.tail + data)[-2048:]
        if self.status != 200:
            if b"\r\n\r\n" in self.head:  # a 529 or error: one read, Content-Length body
                self._finish()
        elif self.tail.endswith(b"0\r\n\r\n") and DONE in self.tail:
            self.ended = True
            self._finish()

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc) -> None:
        self.closed = True
        if not self.opened.done():
            self.opened.set_exception(exc or ConnectionError("closed"))
        if self.warm is not None and not self.warm.done():
            self.warm.set_exception(ConnectionError("closed before warm-up"))
        self._finish()


def completion_tokens(tail: bytes) -> int:
    i = tail.rfind(USAGE)
    if i < 0:
        return -1
    digits = tail[i + len(USAGE):i + len(USAGE) + 12].split(b",")[0].split(b"}")[0]
    try:
        return int(digits)
    except ValueError:
        return -1


async def main(cfg: dict) -> dict:
    loop = asyncio.get_running_loop()
    host, port, n = cfg["host"], cfg["port"], cfg["n"]
    raw = json.dumps(cfg["body"], separators=(",", ":")).encode()
    request = (f"POST {cfg['path']} HTTP/1.1\r\nHost: {host}:{port}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n"
               ).encode() + raw
    conns: list[Conn] = []
    if cfg["mode"] == "kept":  # open and warm every connection before t0
        warm = (f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n").encode()
        for start in range(0, n, 256):
            batch = [Conn() for _ in range(min(256, n - start))]
            await asyncio.gather(*(loop.create_connection(lambda c=c: c, host, port)
                                   for c in batch))
            for c in batch:
                c.warm = loop.create_future()
                c.transport.write(warm)
            await asyncio.gather(*(c.warm for c in batch))
            conns += batch
    await asyncio.sleep(max(0.0, cfg["t0"] - monotonic()))
    started = monotonic()
    if cfg["mode"] == "kept":
        for c in conns:
            c.transport.write(request)
            c.t_write = monotonic()
    else:
        conns = [Conn() for _ in range(n)]

        async def one(c: Conn) -> None:
            await loop.create_connection(lambda: c, host, port)
            c.transport.write(request)
            c.t_write = monotonic()

        outcome = await asyncio.gather(*(one(c) for c in conns), return_exceptions=True)
        for c, result in zip(conns, outcome):
            if isinstance(result, BaseException):
                c.status = -2  # could not connect
                c._finish()
    sent = monotonic()
    remaining = max(1.0, cfg["t_hard"] - monotonic())
    await asyncio.wait([c.done for c in conns], timeout=remaining)
    records = []
    for c in conns:
        records.append({
            "status": c.status, "t_write": c.t_write, "t_first_byte": c.t_first_byte,
            "t_first_token": c.t_first_token, "ended": c.ended,
            "completion_tokens": completion_tokens(c.tail) if c.status == 200 else 0})
        if c.transport is not None:
            c.transport.close()
    return {"started": started, "sent": sent, "records": records}


if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    result = asyncio.run(main(config))
    with open(config["out"], "w") as f:
        json.dump(result, f)
