"""The experiment's lean HTTP/1.1 client over real sockets: against a real `inference-lab
serve` (SSE streams on one keep-alive connection, a real 529 refused before any byte, a
4xx error envelope, a request whose connection the client closes), and against a raw
loopback server for what the gateway does not do on demand (a connection closed mid
stream, `Connection: close`, a body that ends with the connection, a stream written a
few bytes at a time)."""

from __future__ import annotations

import asyncio

import pytest

from inference_lab.experiments.client import (
    Connection,
    ConnectionError_,
    Endpoint,
    Result,
)
from inference_lab.testing.launch import serve
from inference_lab.testing.poll import until

MODEL = "gpt-oss-20b"
MODELLED_KEYS = {"queue_time_s", "ttft_s", "e2e_s", "preemptions"}


@pytest.fixture(scope="module")
def served():
    with serve() as s:
        yield s


class FirstFrame(Connection):
    """A connection that also signals its response's first SSE frame (to await it)."""

    __slots__ = ("streaming",)

    def __init__(self, loop) -> None:
        super().__init__(loop)
        self.streaming = asyncio.Event()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.result is not None and self.result.first:
            self.streaming.set()


async def connect(endpoint: Endpoint, cls=Connection) -> Connection:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(lambda: cls(loop), endpoint.host, endpoint.port)
    return conn


async def test_streams_on_one_keep_alive_connection_give_what_the_records_need(served):
    endpoint = Endpoint(served.base, MODEL)
    conn = await endpoint.connect()
    try:
        for max_tokens in (1, 7, 40):
            result = await asyncio.wait_for(conn.send(endpoint.request(16, max_tokens)), 30)
            assert result.status == 200 and result.error == ""
            assert result.completion_tokens == max_tokens
            assert result.sent < result.first <= result.done
            assert set(result.modelled) == MODELLED_KEYS
            assert 0 < result.modelled["ttft_s"] <= result.modelled["e2e_s"]
            assert result.modelled["preemptions"] == 0
            assert not conn.closed  # the same connection carries the next request
        # The callback form: exactly one call per request, with the caller's context.
        calls: list[tuple[Connection, Result, object]] = []
        done = asyncio.get_running_loop().create_future()

        def on_done(c: Connection, r: Result) -> None:
            calls.append((c, r, c.ctx))
            done.set_result(None)

        conn.start(endpoint.request(8, 3), on_done, ctx="mine")
        with pytest.raises(ConnectionError_):
            conn.start(endpoint.request(8, 3), on_done)  # one request at a time
        await asyncio.wait_for(done, 30)
        await asyncio.sleep(0.05)  # nothing more arrives for it
        assert len(calls) == 1
        c, r, ctx = calls[0]
        assert c is conn and ctx == "mine" and r.status == 200 and r.completion_tokens == 3
    finally:
        conn.close()


def waiting(served) -> int:
    return next(row["waiting"] for row in served.capacity() if row["model"] == MODEL)


async def test_a_real_529_before_any_byte_a_4xx_envelope_and_a_closed_request(served):
    endpoint = Endpoint(served.base, MODEL)
    before = next({k: row[k] for k in ("max_num_seqs", "max_waiting")}
                  for row in served.capacity() if row["model"] == MODEL)
    served.capacity({"model": MODEL, "max_num_seqs": 1, "max_waiting": 1})
    busy = await connect(endpoint, FirstFrame)
    queued, other = await endpoint.connect(), await endpoint.connect()
    try:
        long = busy.send(endpoint.request(16, 5000))  # holds the only running slot
        await asyncio.wait_for(busy.streaming.wait(), 30)
        assert busy.result.status == 200 and busy.result.sent < busy.result.first
        behind = queued.send(endpoint.request(16, 5))  # the only waiting place
        await until(lambda: waiting(served) == 1, timeout=10, what="one request waiting")

        refused = await asyncio.wait_for(other.send(endpoint.request(16, 5)), 30)
        assert refused.status == 529 and refused.first == 0.0  # no stream was started
        assert refused.completion_tokens == 0 and refused.modelled is None
        assert refused.error.startswith('{"error":') and '"code":"queue_saturated"' in refused.error.replace(" ", "")

        # A 4xx with the OpenAI error envelope on the same connection, if it is still open.
        if other.closed:
            other = await endpoint.connect()
        wrong = Endpoint(served.base, "no-such-model")
        bad = await asyncio.wait_for(other.send(wrong.request(16, 5)), 30)
        assert 400 <= bad.status < 500
        assert bad.error.startswith('{"error":') and "no-such-model" in bad.error

        busy.close()  # the client gives up on the long stream: the queued one runs
        with pytest.raises(ConnectionError_):
            await asyncio.wait_for(long, 10)
        with pytest.raises(ConnectionError_):
            busy.send(endpoint.request(16, 5))  # a closed connection refuses at once
        result = await asyncio.wait_for(behind, 30)
        assert result.status == 200 and result.completion_tokens == 5
    finally:
        for conn in (busy, queued, other):
            conn.close()
        served.capacity({"model": MODEL, **before})


# ---- a raw loopback server: what the gateway will not do on demand ------------------------

STREAM_BODY = (b'data: {"choices":[{"index":0,"text":" tok"}],"usage":null}\n\n'
               b'data: {"choices":[{"index":0,"text":"","finish_reason":"length"}],"usage":null,'
               b'"inference_lab":{"queue_time_s":0.5,"ttft_s":0.75,"e2e_s":1.5,"preemptions":2}}\n\n'
               b'data: {"choices":[],"usage":{"prompt_tokens":16,"completion_tokens":2,"total_tokens":18}}\n\n'
               b'data: [DONE]\n\n')
CHUNKED = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
           + b"".join(b"%x\r\n%s\r\n" % (len(frame + b"\n\n"), frame + b"\n\n")
                      for frame in STREAM_BODY.split(b"\n\n") if frame)
           + b"0\r\n\r\n")


async def raw_server(respond):
    """A loopback server; `respond(writer)` answers each request head."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                if not await respond(writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


async def on(server):
    port = server.sockets[0].getsockname()[1]
    endpoint = Endpoint(f"http://127.0.0.1:{port}", MODEL)
    return endpoint, await endpoint.connect()


async def test_a_stream_written_a_few_bytes_at_a_time_is_parsed_the_same():
    async def trickle(writer) -> bool:
        for i in range(0, len(CHUNKED), 3):  # splits the head, every frame and the terminator
            writer.write(CHUNKED[i:i + 3])
            await writer.drain()
            await asyncio.sleep(0)  # a loop turn between writes: the slow writer under test
        return True

    server = await raw_server(trickle)
    endpoint, conn = await on(server)
    try:
        for _ in range(2):  # and the connection is reused
            result = await asyncio.wait_for(conn.send(endpoint.request(16, 2)), 10)
            assert result.status == 200 and result.completion_tokens == 2 and result.first > 0
            assert result.modelled == {"queue_time_s": 0.5, "ttft_s": 0.75, "e2e_s": 1.5,
                                       "preemptions": 2}
    finally:
        conn.close()
        server.close()


async def test_a_connection_closed_mid_stream_is_a_failed_request():
    async def half(writer) -> bool:
        writer.write(CHUNKED[:len(CHUNKED) // 2])
        await writer.drain()
        return False  # and close

    server = await raw_server(half)
    endpoint, conn = await on(server)
    try:
        results: list[Result] = []
        done = asyncio.get_running_loop().create_future()
        conn.start(endpoint.request(16, 2), lambda c, r: (results.append(r), done.set_result(None)))
        await asyncio.wait_for(done, 10)
        (result,) = results
        assert result.status == -1 and "closed" in result.error and result.done >= result.sent
        assert conn.closed
    finally:
        conn.close()
        server.close()


@pytest.mark.parametrize("answer, body", [
    (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 13\r\nConnection: close\r\n\r\n"
     b'{"error":"x"}', '{"error":"x"}'),
    (b"HTTP/1.0 404 Not Found\r\nContent-Type: application/json\r\n\r\n{\"error\":\"until close\"}",
     '{"error":"until close"}'),
])
async def test_connection_close_and_a_body_ending_with_the_connection(answer, body):
    async def once(writer) -> bool:
        writer.write(answer)
        await writer.drain()
        return False

    server = await raw_server(once)
    endpoint, conn = await on(server)
    try:
        result = await asyncio.wait_for(conn.send(endpoint.request(16, 2)), 10)
        assert result.status == int(answer[9:12]) and result.error == body
        assert conn.closed  # not handed out again
    finally:
        conn.close()
        server.close()
