"""A free TCP port on the loopback interface (for `serve`'s engine child, tests, benchmarks)."""

from __future__ import annotations

import random
import socket


def free_port() -> int:
    """A port nothing listens on right now (the OS's pick; another process may take it
    before it is bound, which loopback tests accept)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_run(count: int) -> int:
    """A port p such that p .. p + count - 1 are all free now (`serve --replicas N`
    answers replica i on p + i), below the kernel's ephemeral range, so that client
    connections do not take them later."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    for _ in range(200):
        base = random.randrange(max(low - 12000, 1024), low - count)
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"no run of {count} free ports found")
