"""Picked ports sit below the kernel's ephemeral range, so a port-0 bind (an engine's
`--metrics-port 0`) or a client connection cannot take one between its pick and its bind."""

from __future__ import annotations

import socket

from inference_lab.common.ports import free_port, free_port_run


def _ephemeral_low() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        return int(f.read().split()[0])


def test_free_ports_are_below_the_ephemeral_range_and_bindable():
    low = _ephemeral_low()
    for _ in range(20):
        port = free_port()
        assert 1024 <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_run_of_free_ports_is_consecutive_and_below_the_range():
    low = _ephemeral_low()
    base = free_port_run(5)
    assert 1024 <= base and base + 5 <= low
    sockets = [socket.socket() for _ in range(5)]
    try:
        for offset, s in enumerate(sockets):
            s.bind(("127.0.0.1", base + offset))
    finally:
        for s in sockets:
            s.close()
