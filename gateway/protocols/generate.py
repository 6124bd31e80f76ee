"""The one engine path every API dialect rides: admission, streaming, cancellation.

Knows: that a request (admitted here: gateway.admit) is opened on the engine Session, its
hold on the backlog released once it is sent, and its response headers go out
only after the engine admitted it (a refusal, 529 included, is a bare JSON error in the
route's envelope, never an event stream); how the engine's events become writes (all
tokens pending for a request go out in one write, the dialect's opening with the first of
them); that a non-streaming request waits for Finished; that a request whose client left
has its engine request cancelled (the caller's `finally`); and that a failure after the
headers is the dialect's error frame.

Does not know: any API's shapes (a dialect's `Generation` and `Reply`), gRPC details
(`gateway.engine_client`), fault directives (`gateway.faults` brings its own pump), routes
or metrics (`gateway.app`).
"""

from __future__ import annotations

from typing import Awaitable, Callable

from aiohttp import web

from inference_lab.gateway import aiohttp_gate
from inference_lab.gateway.engine_client import ClientGone, EngineClient, RequestStream
from inference_lab.gateway.errors import (
    ErrorKind, GatewayError, engine_unavailable, from_rejected, log_error,
)
from inference_lab.gateway.protocols.base import (
    Generation, Outcome, Reply, modelled_timings,
)
from inference_lab.v1 import engine_pb2 as pb

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
_FINISH_ABORTED = pb.FINISH_REASON_ABORTED
_FINISH_CANCELLED = pb.FINISH_REASON_CANCELLED


# A pump turns a request's engine events into writes: (request, stream, reply, response,
# the events so far, prompt tokens). `_pump` is the normal one; a fault directive brings
# its own (gateway.faults).
Pump = Callable[[web.Request, RequestStream, Reply, web.StreamResponse, list, int],
                Awaitable[None]]


async def generate(request: web.Request, gen: Generation, client: EngineClient,
                   inflight: dict[RequestStream, web.BaseRequest], sent: Callable[[], None],
                   pump: Pump | None = None, replica: int | None = None,
                   arrived: float | None = None) -> web.StreamResponse:
    """Serve one parsed generation request, its model resolved and admitted here
    (gateway.admit), on `replica` of the model (gateway.fleet); it arrived at `arrived`
    (time.monotonic(), None = unknown). `sent()` is called once the engine request is
    sent (its hold on the backlog goes, gateway.backlog); `inflight` holds it while it is
    open. Without max_tokens the engine chooses the length."""
    reply = gen.reply
    stream = await client.open(gen.model, gen.prompt, gen.max_tokens, priority=gen.priority,
                               request_id=reply.id, n=gen.n, replica=replica, arrived=arrived,
                               reasoning=gen.reasoning, kv_transfer=gen.kv_transfer)
    sent()  # (before the Session's message is built: no await since the Open was queued)
    inflight[stream] = request
    try:
        events = await stream.next_events()  # Admitted or Rejected comes first
        err = rejection(events[0])
        if err is not None:
            if err.kind is ErrorKind.MODEL_NOT_FOUND:
                await refresh_models(client)
            raise err
        if events[0].admitted.reasoning_tokens:
            reply.reasoned(events[0].admitted.reasoning_tokens)
        if gen.stream:
            if pump is None:
                pump = _pump if gen.n == 1 else _pump_sequences
            n_prompt = gen.prompt_tokens
            return await sse_response(
                request, lambda resp: pump(request, stream, reply, resp, events, n_prompt),
                reply.error_frame)
        return await _collect(stream, reply, events, gen.prompt_tokens)
    finally:
        del inflight[stream]
        if not stream.done:
            client.cancel(stream)


def rejection(event: pb.Progress) -> GatewayError | None:
    """The error a request's first event stands for when it is a Rejected (else None)."""
    if not event.HasField("rejected"):
        return None
    r = event.rejected
    return from_rejected(r.code, r.reason, r.message, r.metadata)


async def refresh_models(client: EngineClient) -> None:
    try:
        await client.list_models(refresh=True)
    except GatewayError:
        pass


def finish_error(finished: pb.Finished) -> GatewayError | None:
    """The error a Finished that is not a completion stands for (else None)."""
    if finished.reason == _FINISH_ABORTED:
        return engine_unavailable("the engine aborted the request (shutting down, or its replica crashed)")
    if finished.reason == _FINISH_CANCELLED:
        return engine_unavailable("the engine cancelled the request")
    return None


def outcome_of(finished: list[pb.Finished], n: int, n_prompt: int,
             counts: list[int] | None = None) -> Outcome:
    """The request's outcome from its sequences' Finished events: prompt tokens once, each
    sequence's tokens (`counts`, when the stream counted them), the first sequence's
    modelled times with the end-to-end time of the last to finish."""
    by_index = {f.index: f for f in finished}
    first = by_index.get(0) or finished[0]
    modelled = modelled_timings(first)
    modelled["e2e_s"] = max(f.e2e_s for f in finished)
    if counts is None:
        counts = [by_index[i].completion_tokens if i in by_index else 0 for i in range(n)]
    return Outcome(first.prompt_tokens or n_prompt, counts, modelled, first.cached_tokens,
                   kv_params(first.kv_transfer_params)
                   if first.HasField("kv_transfer_params") else None)


def kv_params(params: pb.KvTransferParams) -> dict:
    """A handoff's kv_transfer_params as vLLM's response carries them (NixlConnector's
    request_finished: every key, the block ids a list)."""
    return {"do_remote_prefill": params.do_remote_prefill,
            "do_remote_decode": params.do_remote_decode,
            "remote_block_ids": list(params.remote_block_ids),
            "remote_engine_id": params.remote_engine_id,
            "remote_request_id": params.remote_request_id,
            "remote_host": params.remote_host, "remote_port": params.remote_port,
            "tp_size": params.tp_size}


def take_finished(events: list[pb.Progress], finished: list[pb.Finished]) -> None:
    """Append the events' Finished to `finished`; raise the error of one that stands for
    a failure (aborted, cancelled by the engine)."""
    for event in events:
        if event.HasField("finished"):
            fin = event.finished
            err = finish_error(fin)
            if err is not None:
                raise err
            finished.append(fin)


async def _collect(stream: RequestStream, reply: Reply, events: list[pb.Progress],
                   n_prompt: int) -> web.Response:
    """Non-streaming: wait for every sequence's Finished; the text has exactly the
    engine's token count."""
    finished: list[pb.Finished] = []
    while True:
        take_finished(events, finished)
        if len(finished) >= stream.n:
            outcome = outcome_of(finished, stream.n, n_prompt)
            if stream.n == 1 and not outcome.counts[0]:
                outcome.counts[0] = stream.total  # an engine that reported no count
            return web.Response(body=reply.body(outcome), content_type="application/json")
        events = await stream.next_events()


async def sse_response(request: web.Request,
                       pump: Callable[[web.StreamResponse], Awaitable[None]],
                       error_frame: Callable[[GatewayError], bytes]) -> web.StreamResponse:
    """Streaming: headers now (the engine admitted), then `pump` writes the events."""
    resp = web.StreamResponse(headers=SSE_HEADERS)
    try:
        await resp.prepare(request)
        try:
            await pump(resp)
        except GatewayError as err:  # the engine went away mid-stream: the error frame
            log_error(err, f"{request.method} {request.path} (in stream)")
            await resp.write(error_frame(err))
    except ConnectionError:  # the client went away: the caller's finally cancels
        raise ClientGone() from None
    return resp


class _Relay:
    """A streaming response's writer, called by the engine client's dispatcher with a
    request's new token total (RequestStream.writer): k new tokens are one
    `reply.tokens(0, k)` (after the opening, with the first of them), written at once,
    without waking the handler's task (a task switch per write is a large share of the
    gateway's CPU per token at hundreds of streams: see docs/benchmarks.md, "Stream cadence";
    and a first token written by the dispatcher goes out a loop iteration sooner). Only
    while the client's socket takes bytes without waiting: when its transport pushes back
    (or is gone) it returns False and the handler's pump writes, and waits, as usual. An
    error is kept for the pump to raise. Once the headers are out (the first write is
    aiohttp's), each later write is one HTTP chunk written to the transport directly
    (aiohttp_gate `direct_chunks`: the writer's coroutine and framing are a sizeable share
    of the gateway's CPU per token).
    Installed by the pump only while aiohttp's fast paths are on (gateway.aiohttp_gate)."""

    __slots__ = ("resp", "reply", "protocol", "head", "streamed", "error", "chunks")

    def __init__(self, request: web.Request, resp: web.StreamResponse, reply: Reply) -> None:
        self.resp = resp
        self.reply = reply
        self.protocol = request.protocol
        self.head = reply.opening()  # until written, with the first tokens
        self.streamed = 0  # tokens written so far (by the relay or the pump)
        self.error: BaseException | None = None
        self.chunks = None  # the response's payload writer, once chunks may bypass it

    def __call__(self, total: int) -> bool:
        protocol = self.protocol
        if self.error is not None or protocol.transport is None or protocol.writing_paused:
            return False
        new = total - self.streamed
        if new <= 0:
            return True
        self.streamed = total
        writer = self.chunks
        if writer is not None:  # (the headers are out: one chunk, written here)
            data = self.reply.tokens(0, new)
            if not data:  # (tokens not shown: max_tokens 0) an empty chunk ends the body
                return True
            if not aiohttp_gate.write_chunk(writer, protocol.transport, data):
                self.chunks = None  # (closing: the pump's write raises aiohttp's error)
                self.streamed -= new
                return False
            return True
        try:  # not paused: aiohttp writes to the transport, no await
            done = aiohttp_gate.write_now(self.resp, self.head + self.reply.tokens(0, new))
        except Exception as exc:  # never into the dispatcher: the pump raises it
            self.error = exc
            return False
        self.head = b""
        if done:
            self.chunks = aiohttp_gate.direct_chunks(self.resp)
            return True
        return False  # it waited for a drain after all: the bytes are out; the pump drains


async def _pump(request: web.Request, stream: RequestStream, reply: Reply,
                resp: web.StreamResponse, events: list[pb.Progress], n_prompt: int) -> None:
    """Turns wake-ups into writes: k new tokens are one `reply.tokens(0, k)`, one write;
    the opening goes out with the first of them (the first bytes mark TTFT). The
    dispatcher writes them itself (`_Relay`) whenever it can; the last tokens go out with
    the closing, in one write."""
    relay = _Relay(request, resp, reply)
    relaying = aiohttp_gate.fast_paths()
    try:
        while True:
            finished = None
            for event in events:
                if event.HasField("finished"):
                    finished = event.finished
            if relay.error is not None:
                raise relay.error
            new = stream.total - relay.streamed
            out = reply.tokens(0, new) if new > 0 else b""
            relay.streamed += max(new, 0)
            if finished is not None:
                err = finish_error(finished)
                if err is not None:
                    if out:
                        await resp.write(relay.head + out)
                    raise err
                missing = finished.completion_tokens - relay.streamed
                if missing > 0:  # never short of the engine's count
                    out += reply.tokens(0, missing)
                    relay.streamed += missing
                outcome = outcome_of([finished], 1, n_prompt, [relay.streamed])
                await resp.write(relay.head + out + reply.closing(outcome))
                return
            if out:
                head, relay.head = relay.head, b""
                await resp.write(head + out)
            if stream.writer is None and relaying:
                stream.writer = relay  # the dispatcher writes what it can
            events = await stream.next_events()
    finally:
        stream.writer = None


class Sequences:
    """One request's sequences as its stream writes them: `advance(events)` takes the
    events of a wake-up and returns every sequence's new tokens (one `reply.tokens(i, k)`
    each; the opening before the first of them), with the closing once every sequence has
    sent its Finished (`outcome` is set then). Raises the error of a Finished that stands
    for a failure."""

    __slots__ = ("stream", "reply", "n_prompt", "head", "streamed", "finished", "outcome")

    def __init__(self, stream: RequestStream, reply: Reply, n_prompt: int) -> None:
        self.stream = stream
        self.reply = reply
        self.n_prompt = n_prompt
        self.head: bytes | None = None  # the opening, until written
        self.streamed = [0] * stream.n
        self.finished: list[pb.Finished] = []
        self.outcome: Outcome | None = None

    def advance(self, events: list[pb.Progress]) -> bytes:
        stream, reply, finished, streamed = self.stream, self.reply, self.finished, self.streamed
        take_finished(events, finished)
        totals = list(stream.totals) if stream.totals is not None else [stream.total]
        for fin in finished:  # never short of the engine's count
            totals[fin.index] = max(totals[fin.index], fin.completion_tokens)
        out = b""
        for i, total in enumerate(totals):
            new = total - streamed[i]
            if new > 0:
                out += reply.tokens(i, new)
                streamed[i] = total
        if len(finished) >= stream.n:
            self.outcome = outcome_of(finished, stream.n, self.n_prompt, streamed)
            out += reply.closing(self.outcome)
        elif not out:
            return b""
        if self.head is None:
            self.head = reply.opening()
        head, self.head = self.head, b""
        return head + out


async def _pump_sequences(request: web.Request, stream: RequestStream, reply: Reply,
                          resp: web.StreamResponse, events: list[pb.Progress],
                          n_prompt: int) -> None:
    """`_pump` for n > 1 sequences: each wake-up writes every sequence's new tokens in
    one write; the closing goes out once every sequence has sent its Finished."""
    sequences = Sequences(stream, reply, n_prompt)
    while True:
        out = sequences.advance(events)
        if out:
            await resp.write(out)
        if sequences.outcome is not None:
            return
        events = await stream.next_events()
