"""What one timed request costs this machine's kernel, whatever the load generator is
written in: the floor under `experiment_loadgen.py`'s CPU per request (target: <= 50
CPU-us at 1,000 requests/s with send delay p99 <= 1 ms).

    python benchmarks/loadgen_floors.py [--rate 1000] [--seconds 5] [--json FILE]

Against the same stub SSE server as experiment_loadgen.py (a child process), each
sender writes pre-built request bytes on 64 keep-alive connections at Poisson instants
and reads each response to its chunked end; nothing is parsed or recorded:
- asyncio: experiment_loadgen's own floor (uvloop, timerfd Timer, Protocol callbacks);
- thread, select: no asyncio at all, one thread whose select() timeout is the next send
  instant (microsecond timeout), watching only the busy sockets;
- thread, epoll: the same with epoll, whose timeout counts whole milliseconds (rounded
  up: sends up to 1 ms late);
- thread, one wake-up: sleep to each send instant only; responses read without waiting
  at the next wake-up, stamped with the kernel's receive time (SO_TIMESTAMPNS), so a
  request costs one wake-up instead of two.
Then the parts: a bare 0.8 ms sleep (one timer wake-up from idle), and a request/response
on a hot connection with no sleep between (send + blocking receive). CPU is the
sender's thread CPU time (the process's for asyncio) over requests sent. Prints
figures, no pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import select
import socket
import struct
import subprocess
import sys
import threading
import time

import numpy as np
from experiment_loadgen import STUB, commit, floor

from inference_lab.experiments.client import Endpoint

TERMINATOR = b"\r\n0\r\n\r\n"
POOL = 64
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)


def connections(port: int, stamped: bool = False) -> list[socket.socket]:
    out = []
    for _ in range(POOL):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if stamped:
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        s.setblocking(False)
        out.append(s)
    return out


def polled(port: int, raw: bytes, rate: float, seconds: float, use_epoll: bool) -> tuple:
    """A sender thread's loop: wait for a response or the next send instant, whichever
    comes first (select: us timeout, busy sockets only; epoll: ms timeout, all)."""
    socks = connections(port)
    by_fd = {s.fileno(): s for s in socks}
    idle, busy = list(socks), []
    ep = select.epoll()
    if use_epoll:
        for fd in by_fd:
            ep.register(fd, select.EPOLLIN)
    rng, delays, mono = random.Random(7), [], time.monotonic
    cpu0 = time.thread_time()
    due = mono() + rng.expovariate(rate)
    end = due + seconds
    while True:
        now = mono()
        while due <= now and due < end:
            s = idle.pop()
            delays.append(now - due)
            s.send(raw)
            busy.append(s.fileno())
            due += rng.expovariate(rate)
        if due >= end and not busy:
            break
        timeout = max(0.0, due - mono()) if due < end else 0.05
        ready = ([fd for fd, _ in ep.poll(timeout)] if use_epoll
                 else select.select(busy, (), (), timeout)[0])
        for fd in ready:
            if by_fd[fd].recv(65536).endswith(TERMINATOR):
                busy.remove(fd)
                idle.append(by_fd[fd])
    cpu = time.thread_time() - cpu0
    ep.close()
    for s in socks:
        s.close()
    return len(delays), cpu, delays


def one_wakeup(port: int, raw: bytes, rate: float, seconds: float) -> tuple:
    """Sleep to the next send instant only; read what came meanwhile without waiting,
    each response's end stamped by the kernel (CLOCK_REALTIME, moved to monotonic)."""
    socks = connections(port, stamped=True)
    idle, busy = list(socks), []
    rng, delays, lat, mono = random.Random(7), [], [], time.monotonic
    offset = time.time() - mono()
    cpu0 = time.thread_time()
    due = mono() + rng.expovariate(rate)
    end = due + seconds
    while True:
        now = mono()
        if due > now:
            time.sleep(due - now)
            now = mono()
        still = []
        for s, sent in busy:
            try:
                data, anc, _, _ = s.recvmsg(65536, 64)
            except BlockingIOError:
                still.append((s, sent))
                continue
            if data.endswith(TERMINATOR):
                sec, nsec = struct.unpack("qq", anc[0][2][:16]) if anc else (0, 0)
                lat.append(sec + nsec * 1e-9 - offset - sent)
                idle.append(s)
            else:
                still.append((s, sent))
        busy = still
        if due >= end:
            if not busy:
                break
            due = now + 0.001
            continue
        while due <= now:
            s = idle.pop()
            t = mono()
            delays.append(t - due)
            s.send(raw)
            busy.append((s, t))
            due += rng.expovariate(rate)
    cpu = time.thread_time() - cpu0
    for s in socks:
        s.close()
    return len(delays), cpu, delays, lat


def parts(port: int, raw: bytes, n: int = 3000) -> tuple[float, float]:
    """CPU-us of one 0.8 ms sleep, and of one request/response on a hot connection."""
    cpu0 = time.thread_time()
    for _ in range(n):
        time.sleep(0.0008)
    sleep_us = 1e6 * (time.thread_time() - cpu0) / n
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    cpu0 = time.thread_time()
    for _ in range(n):
        s.send(raw)
        while not s.recv(65536).endswith(TERMINATOR):
            pass
    hot_us = 1e6 * (time.thread_time() - cpu0) / n
    s.close()
    return sleep_us, hot_us


def in_thread(fn, *args):
    out = []
    thread = threading.Thread(target=lambda: out.append(fn(*args)))
    thread.start()
    thread.join()
    return out[0]


def line(name: str, n: int, cpu: float, delays) -> str:
    d = np.array(delays) * 1000
    return (f"  {name:<27} {1e6 * cpu / max(n, 1):6.1f} CPU-us per request; send delay p50 "
            f"{np.percentile(d, 50):.3f} ms, p99 {np.percentile(d, 99):.3f} ms ({n} sent)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args()
    stub = subprocess.Popen([sys.executable, "-c", STUB], stdout=subprocess.PIPE)
    try:
        port = int(stub.stdout.readline())
        raw = Endpoint(f"http://127.0.0.1:{port}", "gpt-oss-20b").request(16, 1)
        try:
            import uvloop
            aio = uvloop.run(floor(port, args.rate, args.seconds))
        except ImportError:
            aio = asyncio.run(floor(port, args.rate, args.seconds))
        aio = aio[0], aio[1], np.array(aio[2]) / 1000  # its delays come in ms
        sel = in_thread(polled, port, raw, args.rate, args.seconds, False)
        epl = in_thread(polled, port, raw, args.rate, args.seconds, True)
        n, cpu, delays, lat = in_thread(one_wakeup, port, raw, args.rate, args.seconds)
        sleep_us, hot_us = in_thread(parts, port, raw)
    finally:
        stub.terminate()
        stub.wait(5)
    print(f"load generator floors, open loop {args.rate:.0f}/s for {args.seconds:g} s against a stub "
          f"SSE server (load average {os.getloadavg()[0]:.2f}, commit {commit()})")
    print(line("asyncio (uvloop, timerfd)", *aio))
    print(line("thread, select", *sel))
    print(line("thread, epoll (ms timeout)", *epl))
    lat_ms = np.array(lat) * 1000
    print(line("thread, one wake-up", n, cpu, delays)
          + f"; response time by kernel stamp p50 {np.percentile(lat_ms, 50):.3f} ms")
    print(f"  parts: one 0.8 ms sleep {sleep_us:.1f} CPU-us; a request/response on a hot "
          f"connection {hot_us:.1f} CPU-us")
    if args.json:
        def figures(n, cpu, delays) -> dict:
            d = np.array(delays) * 1000
            return {"sent": n, "cpu_us_per_request": 1e6 * cpu / max(n, 1),
                    "send_delay_p50_ms": float(np.percentile(d, 50)),
                    "send_delay_p99_ms": float(np.percentile(d, 99))}
        with open(args.json, "w") as f:
            json.dump({"asyncio": figures(*aio), "select": figures(*sel), "epoll": figures(*epl),
                       "one_wakeup": figures(n, cpu, delays),
                       "kernel_stamp_p50_ms": float(np.percentile(lat_ms, 50)),
                       "sleep_us": sleep_us, "hot_us": hot_us}, f, indent=1)


if __name__ == "__main__":
    main()
