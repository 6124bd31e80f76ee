"""A cheap HTTP/1.1 load generator for the benchmarks (one process; run several for more).

    python benchmarks/_loadgen.py '<json config>'   # writes its JSON result to config["out"]

Raw asyncio Protocols on uvloop, keep-alive connections, pre-built request bytes; a
response is parsed only as far as needed: the status line, Content-Length or the chunked
terminator, and a count of SSE frames (b"data: ") and of HTTP chunks (one per server
write: every chunk the gateway writes ends with b"\\n\\n\\r\\n"). The last two reads of a
stream are kept to decode the engine's modelled timings ("inference_lab") from the final
chunk. Nothing else is decoded.

Modes (config["mode"]):
- "closed": `clients` connections, each a closed loop of streaming requests (client i on
  `ports[i % len(ports)]` when `ports` is given, else on `port`; each record ends with its
  port). Every client starts at `t0 + stagger * i / clients`; requests sent in [t_warm, t_end) are recorded;
  frames and writes received in [t_warm, t_end) are counted. After t_end, clients keep
  the load up until every recorded request has finished (or `t_hard`), then everything
  is closed.
- "open": open loop at `rate` requests/s from `t0` for `count` requests (non-streaming),
  on a pool of keep-alive connections (grown up to `max_conns` when all are busy; a
  request with no connection available is counted as skipped). Latency is measured from
  the write and, separately, from the scheduled instant (no coordinated omission).

Inter-event gaps (closed mode): for every token event a stream receives after its first
read in [t_warm, t_end), the time since the previous read that carried events (0 for the
second and later events of one read: what ITL tools measure per chunk), counted in
`gaps`, a histogram of GAP_BUCKET-wide buckets (the last holds everything longer). The
final read's closing frames (final chunk, [DONE]) are not token events.

Times are time.monotonic() (CLOCK_MONOTONIC: the same clock in every process).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

monotonic = time.monotonic
TERMINATOR = b"\r\n0\r\n\r\n"
MARK = b'"inference_lab":'
GAP_BUCKET = 10e-6  # inter-event gap histogram: 10 us buckets up to 100 ms
GAP_BUCKETS = 10_000
CLOSING_FRAMES = 2  # in a stream's last read: its final chunk and [DONE]


def request_bytes(host: str, port: int, path: str, body: dict) -> bytes:
    raw = json.dumps(body, separators=(",", ":")).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n").encode() + raw


def modelled_from(tail: bytes) -> list | None:
    """[queue_time_s, ttft_s, e2e_s, preemptions] from the final chunk, if present."""
    i = tail.rfind(MARK)
    if i < 0:
        return None
    try:
        obj, _ = json.JSONDecoder().raw_decode(tail[i + len(MARK):].decode("utf-8", "replace"))
        return [obj["queue_time_s"], obj["ttft_s"], obj["e2e_s"], obj["preemptions"]]
    except (ValueError, KeyError, TypeError):
        return None


class Conn(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    __slots__ = ("gen", "transport", "waiter", "head", "status", "length", "chunked", "got",
                 "prev", "last", "frames", "writes", "t_first", "t_read", "lost")

    def __init__(self, gen: "Gen") -> None:
        self.gen = gen
        self.transport = None
        self.waiter: asyncio.Future | None = None
        self.lost = False
        self._reset()

    def _reset(self) -> None:
        self.head = b""
        self.status = 0
        self.length = -1
        self.chunked = False
        self.got = 0
        self.prev = b""
        self.last = b""
        self.frames = 0
        self.writes = 0
        self.t_first = 0.0
        self.t_read = 0.0  # the last read that carried events

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.lost = True
        w = self.waiter
        if w is not None and not w.done():
            w.set_exception(ConnectionError(f"connection lost: {exc!r}"))

    def send(self, data: bytes) -> asyncio.Future:
        self._reset()
        self.waiter = self.gen.loop.create_future()
        self.transport.write(data)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        now = monotonic()
        if not self.status:
            self.head += data
            i = self.head.find(b"\r\n\r\n")
            if i < 0:
                return
            head, data = self.head[:i], self.head[i + 4:]
            self.head = b""
            self.status = int(head[9:12])
            low = head.lower()
            j = low.find(b"content-length:")
            if j >= 0:
                k = low.find(b"\r\n", j)
                self.length = int(low[j + 15:k if k >= 0 else None])
            self.chunked = b"transfer-encoding: chunked" in low
            if not data:
                if self.length == 0:
                    self._done(now)
                return
        if self.chunked:
            prev = self.last
            n = data.count(b"data: ")
            w = data.count(b"\n\n\r\n")
            if prev:
                n += (prev[-5:] + data[:5]).count(b"data: ")
                w += (prev[-3:] + data[:3]).count(b"\n\n\r\n")
            done = data.endswith(b"0\r\n\r\n") and (prev[-7:] + data).endswith(TERMINATOR)
            if n:
                if not self.t_first:
                    self.t_first = now
                self.frames += n
                self.writes += w
                gen = self.gen
                if gen.t_warm <= now < gen.t_end:
                    gen.win_frames += n
                    gen.win_writes += w
                    if self.t_read:
                        gen.gap(now - self.t_read, n - CLOSING_FRAMES if done else n)
                self.t_read = now
            self.prev, self.last = prev, data
            if done:
                self._done(now)
        else:
            self.got += len(data)
            self.last = self.last + data if len(self.last) < 65536 else self.last
            if self.got >= self.length:
                self._done(now)

    def _done(self, now: float) -> None:
        w = self.waiter
        self.waiter = None
        if w is not None and not w.done():
            w.set_result(now)


class Gen:
    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.loop = asyncio.get_running_loop()
        self.t0 = cfg["t0"]
        self.t_warm = cfg.get("t_warm", self.t0)
        self.t_end = cfg.get("t_end", float("inf"))
        self.t_hard = cfg["t_hard"]
        self.win_frames = 0
        self.win_writes = 0
        self.gaps = [0] * (GAP_BUCKETS + 1)
        self.errors: dict[str, int] = {}
        self.conns: list[Conn] = []

    async def connect(self, port: int | None = None) -> Conn:
        _, conn = await self.loop.create_connection(lambda: Conn(self), self.cfg["host"],
                                                    port or self.cfg["port"])
        self.conns.append(conn)
        return conn

    def gap(self, seconds: float, events: int) -> None:
        """A read with `events` token events, `seconds` after the stream's previous one."""
        if events > 0:
            gaps = self.gaps
            gaps[min(int(seconds / GAP_BUCKET), GAP_BUCKETS)] += 1
            gaps[0] += events - 1

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def close_all(self) -> None:
        for c in self.conns:
            if c.transport is not None:
                c.transport.abort()

    # ---- closed loop of streams ------------------------------------------------------------
    async def closed(self) -> dict:
        cfg = self.cfg
        n = cfg["clients"]
        ports = cfg.get("ports") or [cfg["port"]]  # client i on ports[i % len(ports)]
        reqs = {p: request_bytes(cfg["host"], p, cfg["path"], cfg["body"]) for p in ports}
        records: list[list] = []
        state = {"pending": 0}
        finished = asyncio.Event()
        sent = [0]

        def check() -> None:
            if state["pending"] == 0 and monotonic() >= self.t_end:
                finished.set()

        async def client(i: int) -> None:
            conn = None
            port = ports[i % len(ports)]
            req = reqs[port]
            start = self.t0 + cfg.get("stagger", 0.0) * i / max(n, 1)
            try:
                conn = await self.connect(port)
            except OSError as exc:
                self.error(f"connect: {type(exc).__name__}")
                return
            await asyncio.sleep(max(0.0, start - monotonic()))
            while not finished.is_set():
                now = monotonic()
                if now >= self.t_hard:
                    return
                if now >= self.t_end and state["pending"] == 0:
                    finished.set()
                    return
                recorded = self.t_warm <= now < self.t_end
                if recorded:
                    state["pending"] += 1
                sent[0] += 1
                t_send = monotonic()
                try:
                    if conn.lost:
                        conn = await self.connect(port)
                    t_done = await conn.send(req)
                except (ConnectionError, OSError) as exc:
                    self.error(type(exc).__name__)
                    if recorded:
                        state["pending"] -= 1
                        check()
                    await asyncio.sleep(0.05)
                    continue
                if conn.status != 200:
                    self.error(f"http {conn.status}")
                    await asyncio.sleep(0.01)  # no hot loop against a failing server
                elif recorded:
                    records.append([t_send, conn.t_first, t_done, conn.frames, conn.writes,
                                    modelled_from(conn.prev[-4096:] + conn.last[-4096:]), port])
                if recorded:
                    state["pending"] -= 1
                    check()

        tasks = [self.loop.create_task(client(i)) for i in range(n)]
        self.loop.call_at(self.loop.time() + max(0.0, self.t_end - monotonic()) + 0.01, check)
        try:
            await asyncio.wait_for(finished.wait(), max(0.1, self.t_hard - monotonic()))
        except asyncio.TimeoutError:
            pass
        unfinished = state["pending"]
        self.close_all()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return {"records": records, "unfinished": unfinished, "win_frames": self.win_frames,
                "win_writes": self.win_writes, "sent": sent[0], "gaps": self.gaps}

    # ---- open loop of short requests --------------------------------------------------------
    async def open(self) -> dict:
        cfg = self.cfg
        req = request_bytes(cfg["host"], cfg["port"], cfg["path"], cfg["body"])
        rate, count = cfg["rate"], cfg["count"]
        idle: list[Conn] = []
        for _ in range(cfg.get("conns", 32)):
            idle.append(await self.connect())
        records: list[list] = []
        statuses: dict[int, int] = {}
        outstanding: set[asyncio.Task] = set()
        skipped = 0
        max_conns = cfg.get("max_conns", 512)
        latest_send = [self.t0]

        async def one(conn: Conn, t_sched: float) -> None:
            t_send = monotonic()
            try:
                t_done = await conn.send(req)
            except (ConnectionError, OSError) as exc:
                self.error(type(exc).__name__)
                return
            statuses[conn.status] = statuses.get(conn.status, 0) + 1
            records.append([t_sched, t_send, t_done, conn.status])
            if not conn.lost:
                idle.append(conn)

        await asyncio.sleep(max(0.0, self.t0 - monotonic()))
        interval = 1.0 / rate
        for i in range(count):
            due = self.t0 + i * interval
            now = monotonic()
            if now >= self.t_hard:
                break
            if due > now:
                await asyncio.sleep(due - now)
            if idle:
                conn = idle.pop()
            elif len(self.conns) < max_conns:
                try:
                    conn = await self.connect()
                except OSError as exc:
                    self.error(f"connect: {type(exc).__name__}")
                    skipped += 1
                    continue
            else:
                skipped += 1
                continue
            task = self.loop.create_task(one(conn, due))
            outstanding.add(task)
            task.add_done_callback(outstanding.discard)
            latest_send[0] = monotonic()
        if outstanding:
            await asyncio.wait(outstanding, timeout=max(0.1, self.t_hard - monotonic()))
        unfinished = len(outstanding)
        self.close_all()
        for t in list(outstanding):
            t.cancel()
        return {"records": records, "statuses": statuses, "skipped": skipped,
                "unfinished": unfinished, "conns": len(self.conns),
                "last_send": latest_send[0]}


async def main(cfg: dict) -> dict:
    gen = Gen(cfg)
    result = await (gen.closed() if cfg["mode"] == "closed" else gen.open())
    result["errors"] = gen.errors
    result["cpu_s"] = sum(os.times()[:2])
    return result


if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    try:
        import uvloop
        out = uvloop.run(main(config))
    except ImportError:
        out = asyncio.run(main(config))
    with open(config["out"], "w") as f:
        json.dump(out, f, separators=(",", ":"))
