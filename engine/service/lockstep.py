"""The datagrams that keep an MoE model's data-parallel ranks in lockstep across processes.

Knows: one UDP socket on 127.0.0.1 per engine process of a data-parallel group (`serve
--data-parallel-size D` gives each rank a port and the list of all, in rank order), and
its message: (the model's index in the served list, the step's start, its end), three
numbers in network order, sent to every peer for every step a rank books of an MoE model
(engine.drivers.lockstep has the rule; the pacer applies it). A datagram from anyone but
a listed peer's address, or of another size, is dropped; so is one for a model this
process does not hold in lockstep. Loopback UDP does not reorder or drop under the rates
here (one datagram per step per peer), and a lost one costs one step's alignment, not
correctness of anything admitted.

Does not know: the pacer's rules, the fleet, gRPC.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable

log = logging.getLogger(__name__)

_MESSAGE = struct.Struct("!Hdd")  # model index, start, end (time.monotonic())


class LockstepLink(asyncio.DatagramProtocol):
    """This rank's socket: sends its steps to the peers, hands theirs to `on_peer`."""

    def __init__(self, port: int, peers: list[int],
                 on_peer: Callable[[int, float, float], None]) -> None:
        self.port = port
        self.peers = [("127.0.0.1", p) for p in peers if p != port]
        self._on_peer = on_peer
        self._allowed = set(self.peers)
        self.transport: asyncio.DatagramTransport | None = None

    async def open(self) -> "LockstepLink":
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(lambda: self, local_addr=("127.0.0.1", self.port))
        return self

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        if len(data) != _MESSAGE.size or addr[:2] not in self._allowed:
            return
        model, start, end = _MESSAGE.unpack(data)
        self._on_peer(model, start, end)

    def sender(self, model: int) -> Callable[[float, float], None]:
        """What a model's Lockstep calls to tell every peer of a step."""
        def send(start: float, end: float) -> None:
            transport = self.transport
            if transport is None:
                return
            payload = _MESSAGE.pack(model, start, end)
            for peer in self.peers:
                transport.sendto(payload, peer)
        return send

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None
