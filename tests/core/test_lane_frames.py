"""The Session lane's framing (inference_lab.lane.frames), fed bytes by hand: frames come
out whole and in order however the reads split them, and an oversize length closes the
connection instead of growing a buffer."""

from __future__ import annotations

from inference_lab.lane.frames import HEADER, MAX_FRAME, FrameError, FrameProtocol, frame


class Transport:  # the slice of an asyncio transport the protocol touches
    def __init__(self) -> None:
        self.closed = False
        self.written: list[bytes] = []

    def get_extra_info(self, name: str):
        return None

    def set_write_buffer_limits(self, high: int) -> None:
        self.high = high

    def is_closing(self) -> bool:
        return self.closed

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True


class Recorder(FrameProtocol):
    def __init__(self) -> None:
        super().__init__()
        self.frames: list[bytes] = []
        self.on_frame = lambda payload: self.frames.append(bytes(payload))
        self.ended: list[Exception | None] = []
        self.connection_made(Transport())

    def lost(self, exc: Exception | None) -> None:
        self.ended.append(exc)


PAYLOADS = [b"", b"a", b"hello world", bytes(range(256)) * 40]
STREAM = b"".join(frame(p) for p in PAYLOADS)


def test_frames_in_one_read_come_out_in_order():
    proto = Recorder()
    proto.data_received(STREAM)
    assert proto.frames == PAYLOADS and not proto._buffer


def test_frames_split_at_every_byte_come_out_whole():
    proto = Recorder()
    for i in range(len(STREAM)):
        proto.data_received(STREAM[i:i + 1])
    assert proto.frames == PAYLOADS and not proto._buffer


def test_frames_split_in_uneven_chunks_come_out_whole():
    for chunk in (3, 7, 1000, 4099):
        proto = Recorder()
        for i in range(0, len(STREAM), chunk):
            proto.data_received(STREAM[i:i + chunk])
        assert proto.frames == PAYLOADS, chunk


def test_an_oversize_length_closes_the_connection_once():
    proto = Recorder()
    proto.data_received(frame(b"ok") + HEADER.pack(MAX_FRAME + 1) + b"junk")
    assert proto.frames == [b"ok"] and proto.transport.closed
    assert len(proto.ended) == 1 and isinstance(proto.ended[0], FrameError)
    proto.data_received(frame(b"after"))  # nothing more is parsed
    proto.connection_lost(None)
    assert proto.frames == [b"ok"] and len(proto.ended) == 1


def test_a_write_is_one_frame():
    proto = Recorder()
    proto.write(b"abc")
    assert proto.transport.written == [HEADER.pack(3) + b"abc"]


def test_credited_bytes_do_not_count_against_the_window():
    proto = Recorder()
    proto.window = 512
    proto.write(b"x" * 100)
    proto.write(b"m" * 100_000)  # a batch carrying a metrics copy
    assert proto.pushing_back()
    proto.credit(100_000 - 50)  # its bulk: not what the window paces
    assert not proto.pushing_back() and proto.sent - proto.acked == 104 + 104 - 50
    proto.acknowledge(104)  # an acknowledgement behind the credit changes nothing
    assert proto.sent - proto.acked == 158
    proto.acknowledge(proto.sent)
    assert proto.acked == proto.sent
    proto.credit(10)  # never beyond what was written
    assert proto.acked == proto.sent
