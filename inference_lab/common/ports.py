"""Free TCP ports on the loopback interface (for `serve`'s engine child, tests, benchmarks),
and the check of a start-up's fixed ports before any is bound.

Both pick below the kernel's ephemeral range: a port the OS hands out for `bind(0)` (an
engine's `--metrics-port 0`, a client connection) can never be one picked here, so a
process started on a picked port cannot find it taken by another's port-0 bind in between.
"""

from __future__ import annotations

import random
import socket


def free_port() -> int:
    """A port nothing listens on right now, below the ephemeral range (another process
    may still take it before it is bound, which loopback tests accept)."""
    try:
        return free_port_run(1)
    except (OSError, ValueError, RuntimeError):  # no /proc, or no room below the range
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]


def free_port_run(count: int) -> int:
    """A port p such that p .. p + count - 1 are all free now (`serve --replicas N`
    answers replica i on p + i), below the kernel's ephemeral range, so that client
    connections and port-0 binds do not take them later."""
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


def port_clashes(named: list[tuple[str, int]]) -> list[str]:
    """What is wrong with a start-up's fixed ports, given as (what, port): one sentence per
    port outside 1..65535 and per port two things would bind (empty when none), so that
    a command can refuse before it binds any."""
    problems = [f"{what} would be {port}, outside 1..65535" for what, port in named
                if not 0 < port < 65536]
    first: dict[int, str] = {}
    for what, port in named:
        if port in first:
            problems.append(f"port {port} is both {first[port]} and {what}")
        else:
            first[port] = what
    return problems
