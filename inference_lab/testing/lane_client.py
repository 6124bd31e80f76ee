"""A raw Session lane client (tests and benchmarks): the engine's lane
(engine.service.lane) spoken frame by frame, as a minimal or a misbehaving client would,
with a gRPC Session call's write / read / done_writing."""

from __future__ import annotations

import asyncio

from inference_lab.common.clock import clock_id
from inference_lab.lane.frames import HEADER
from inference_lab.v1 import engine_pb2 as pb


class RawLane:
    """One lane connection: `hello()`, then `write(SessionActions)` / `read()` like a gRPC
    Session call (`read()` is None at EOF)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 window: int = 0) -> None:
        self.reader, self.writer = reader, writer
        self.window = window  # the engine's flow-control window (0: unknown)
        self.acks = True  # acknowledge reads as the gateway does (False: never)
        self.received = 0  # bytes of frames read, length prefixes included
        self._told = 0

    @classmethod
    async def connect(cls, info: pb.SessionLaneInfo) -> "RawLane":
        return cls(*await asyncio.open_connection(info.host, info.port), info.window_bytes)

    @classmethod
    async def open(cls, stub, clock: str | None = None) -> "RawLane":
        """A lane to the engine behind `stub` (its SessionLane answer), past the hello."""
        info = await stub.SessionLane(pb.SessionLaneRequest())
        lane = await cls.connect(info)
        if await lane.hello(info.token, clock) is None:
            raise ConnectionError("the engine closed the lane")
        return lane

    async def hello(self, token: bytes, clock: str | None = None) -> pb.LaneHello | None:
        self.send_raw(pb.LaneHello(token=token, clock_id=clock or clock_id() or "")
                      .SerializeToString())
        payload = await self.read_raw()
        return None if payload is None else pb.LaneHello.FromString(payload)

    def send_raw(self, payload: bytes, length: int | None = None) -> None:
        self.writer.write(HEADER.pack(len(payload) if length is None else length) + payload)

    async def write(self, message: pb.SessionActions) -> None:
        self.send_raw(message.SerializeToString())
        await self.writer.drain()

    async def read_raw(self, timeout: float = 5.0) -> bytes | None:
        try:
            async with asyncio.timeout(timeout):
                header = await self.reader.readexactly(HEADER.size)
            async with asyncio.timeout(timeout):
                payload = await self.reader.readexactly(HEADER.unpack(header)[0])
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        self.received += HEADER.size + len(payload)
        if self.acks and self.window and self.received - self._told >= self.window // 2:
            self.acknowledge()
        return payload

    def acknowledge(self) -> None:
        """Tell the engine every byte read so far (its flow control)."""
        self._told = self.received
        self.send_raw(pb.SessionActions(lane_read_bytes=self.received).SerializeToString())

    async def read(self) -> pb.ProgressBatch | None:
        payload = await self.read_raw()
        return None if payload is None else pb.ProgressBatch.FromString(payload)

    def close(self) -> None:
        self.writer.close()

    async def done_writing(self) -> None:
        self.close()
