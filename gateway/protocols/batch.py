"""The engine path of a request of several prompts (a completions `prompt` that is a list
of prompts): one engine request per prompt, admitted all or none, one response.

Knows: that every prompt is opened on the Session at once (one arrival stamp, queued for
one Session message), each with its own prefill and place in the queue as vLLM gives it;
that the response starts only once the engine admitted every one of them, and that a
refusal of any (a 529, a 400, ...) cancels those already admitted (the engine counts them
aborted, as vLLM counts an aborted request) and is the answer for the batch as a whole;
how the prompts' engine events become writes (streaming: each wake-up writes every
prompt's new tokens in one write, a prompt's opening with its first tokens and its
choices' final chunks when it finishes, then the reply's closing once every prompt has);
that a non-streaming batch waits for every Finished; and that a hang-up, or any failure,
cancels every engine request of the batch (the `finally`).

Does not know: the API's shapes (`Batch`, `BatchReply`), gRPC details
(`gateway.engine_client`), routes or metrics (`gateway.app`).
"""

from __future__ import annotations

from typing import Callable

from aiohttp import web

from inference_lab.gateway.engine_client import (
    ClientGone, EngineClient, RequestStream, any_ready,
)
from inference_lab.gateway.errors import ErrorKind, GatewayError
from inference_lab.gateway.protocols.base import Batch, BatchReply, Outcome
from inference_lab.gateway.protocols.generate import (
    Sequences, outcome_of, refresh_models, rejection, sse_response, take_finished,
)
from inference_lab.v1 import engine_pb2 as pb


async def generate_batch(request: web.Request, batch: Batch, client: EngineClient,
                         inflight: dict[RequestStream, web.BaseRequest],
                         sent: Callable[[], None], replica: int | None = None,
                         arrived: float | None = None) -> web.StreamResponse:
    """Serve one parsed request of several prompts, its model resolved and admitted here
    (gateway.admit), on `replica` of the model; it arrived at `arrived` (time.monotonic(),
    None = unknown). `sent()` is called once every prompt is sent; `inflight` holds each
    of its engine requests while it is open."""
    reply = batch.reply
    streams: list[RequestStream] = []
    try:
        for p, prompt in enumerate(batch.prompts):
            stream = await client.open(batch.model, prompt, batch.max_tokens,
                                       priority=batch.priority, request_id=f"{reply.id}-{p}",
                                       n=batch.n, replica=replica, arrived=arrived)
            streams.append(stream)
            inflight[stream] = request
        sent()  # (before the Session's message is built: no await since the last Open)
        events = await _admit(streams, client, batch.where)
        if batch.stream:
            return await sse_response(
                request, lambda resp: _pump(streams, reply, resp, events, batch), reply.error_frame)
        return await _collect(request, streams, reply, events, batch)
    finally:
        for stream in streams:
            del inflight[stream]
            if not stream.done:
                client.cancel(stream)


async def _admit(streams: list[RequestStream], client: EngineClient,
                 where: str = "$.prompt[{}]") -> list[list[pb.Progress]]:
    """Each prompt's events so far, once the engine admitted every one; the first refusal
    (in prompt order) is raised: the caller's `finally` cancels the admitted ones."""
    admitted = []
    for p, stream in enumerate(streams):
        events = await stream.next_events()  # Admitted or Rejected comes first
        err = rejection(events[0])
        if err is not None:
            if err.kind is ErrorKind.MODEL_NOT_FOUND:
                await refresh_models(client)
            if err.kind is ErrorKind.INVALID_REQUEST:  # name the prompt it is about
                err = GatewayError(err.kind, f"{err.message} - at `{where.format(p)}`", err.headers)
            raise err
        admitted.append(events)
    return admitted


async def _pump(streams: list[RequestStream], reply: BatchReply, resp: web.StreamResponse,
                events: list[list[pb.Progress]], batch: Batch) -> None:
    """Each wake-up writes every prompt's new tokens in one write (`Sequences` per prompt:
    its opening first, its choices' final chunks when it finished); the reply's closing
    goes out with the last of them."""
    prompts = [Sequences(stream, part, len(prompt))
               for stream, part, prompt in zip(streams, reply.parts, batch.prompts)]
    pending: list[Sequences] = []
    out = []
    for sequences, first in zip(prompts, events):
        out.append(sequences.advance(first))
        if sequences.outcome is None:
            pending.append(sequences)
    while pending:
        if any(out):
            await resp.write(b"".join(out))
        out = []
        await any_ready([s.stream for s in pending])
        waiting = []
        for sequences in pending:
            if sequences.stream.ready:
                out.append(sequences.advance(await sequences.stream.next_events()))
            if sequences.outcome is None:
                waiting.append(sequences)
        pending = waiting
    out.append(reply.closing([s.outcome for s in prompts]))
    await resp.write(b"".join(out))


async def _collect(request: web.Request, streams: list[RequestStream], reply: BatchReply,
                   events: list[list[pb.Progress]], batch: Batch) -> web.StreamResponse:
    """Not streaming: wait for every prompt's every Finished; each text has exactly the
    engine's token count. The body is written in the reply's pieces (`BatchReply.chunks`):
    one piece is a plain response with its length; more are written one at a time
    (chunked), each once the client has taken the one before it, so a large body is never
    held whole."""
    finished: list[list[pb.Finished]] = [[] for _ in streams]
    pending = list(range(len(streams)))
    for p in pending:
        take_finished(events[p], finished[p])
    while True:
        pending = [p for p in pending if len(finished[p]) < streams[p].n]
        if not pending:
            break
        await any_ready([streams[p] for p in pending])
        for p in pending:
            if streams[p].ready:
                take_finished(await streams[p].next_events(), finished[p])
    outcomes: list[Outcome] = []
    for stream, done, prompt in zip(streams, finished, batch.prompts):
        outcome = outcome_of(done, stream.n, len(prompt))
        if stream.n == 1 and not outcome.counts[0]:
            outcome.counts[0] = stream.total  # an engine that reported no count
        outcomes.append(outcome)
    pieces = reply.chunks(outcomes)
    first = next(pieces)
    second = next(pieces, None)
    if second is None:
        return web.Response(body=first, content_type="application/json")
    resp = web.StreamResponse()
    resp.content_type = "application/json"
    try:
        await resp.prepare(request)
        await resp.write(first)
        del first
        await resp.write(second)
        del second
        for piece in pieces:
            await resp.write(piece)
        await resp.write_eof()
    except ConnectionError:  # the client went away: the caller's finally cancels
        raise ClientGone() from None
    return resp
