"""A free TCP port on the loopback interface (for `serve`'s engine child, tests, benchmarks)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on right now (the OS's pick; another process may take it
    before it is bound, which loopback tests accept)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
