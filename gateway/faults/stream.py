"""Carrying out a fault directive on the wire of a streaming response (aiohttp).

Knows: the frames each mode writes (shapes after inference-lab's fault reference: role
frame, content frames, the torn frame, the error bodies of OpenRouter, vLLM and dynamo),
for both endpoint flavours (chat chunks with deltas; text_completion chunks, where
reasoning and tool calls are raw text as a base model would write them); how a connection
is ended abruptly: a FIN without the chunked terminator (`transport.close()`), or an RST
(`SO_LINGER` 0, then `transport.abort()`), each after what was written has left the
process; and the scripted stream (`after_chunks` placeholder frames `delay_ms` apart),
which does not touch the engine (`serve_scripted`). A fault that fires inside a real paced
stream (`after_tokens`) is a pump of its own for the engine path (`pump_until_fault`).

Does not know: the header's grammar (gateway.faults.directive) or the engine.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct

from aiohttp import web

from inference_lab.gateway.engine_client import ClientGone, RequestStream
from inference_lab.gateway.faults.directive import FaultMode, FaultSpec
from inference_lab.gateway.protocols.base import DONE_FRAME, PLACEHOLDER_TOKEN, json_encode
from inference_lab.gateway.protocols.generate import SSE_HEADERS, Pump, finish_error
from inference_lab.gateway.protocols.openai.render import Completion

log = logging.getLogger("inference_lab.gateway.faults")

# Representative error bodies (inference-lab's fault reference gives the shapes; the
# dynamo cancellation body is exact there).
OPENROUTER_ERROR = json_encode({"error": {
    "message": "Provider returned error", "code": 502,
    "metadata": {"provider_name": "inference-lab",
                 "raw": "simulated upstream provider failure (fault: error_envelope_200)"}}})
VLLM_400 = json_encode({
    "object": "error", "type": "BadRequestError", "param": None, "code": 400,
    "message": "This request would exceed the model's maximum context length "
               "(fault: error_400_in_sse)"})
DYNAMO_499 = b'{"error":{"code":499,"message":"CancelledError: ","type":"request_cancelled"}}'
UTF8_WORD = "caf\u00e9 "  # "é" is two bytes (0xC3 0xA9): the cut lands between them
TOOL_NAME = "get_current_weather"
TOOL_ID = "call_fault_0"
TOOL_ARGS_OPEN = '{"location":"San Francisco, CA","notes":"'
TEXT_REASONING_OPEN = "<think>"
TEXT_TOOL_OPEN = '{"name":"get_current_weather","arguments":' + TOOL_ARGS_OPEN
FLUSH_GRACE_S = 0.025  # what was written reaches the peer before an abrupt end
_DRAIN_LIMIT_S = 1.0


def _sse(body: bytes) -> bytes:
    return b"data: " + body + b"\n\n"


class Frames:
    """The frames of one faulting response, chat or text completion."""

    def __init__(self, completion: Completion, spec: FaultSpec, n_prompt: int) -> None:
        self.c = completion
        self.spec = spec
        self.n_prompt = n_prompt

    def _chunk(self, choices: list) -> bytes:
        c = self.c
        return _sse(json_encode({
            "id": c.id, "object": "chat.completion.chunk" if c.chat else "text_completion",
            "created": c.created, "model": c.model, "choices": choices}))

    def _delta(self, delta: dict) -> bytes:
        return self._chunk([{"index": 0, "delta": delta}])

    def _text(self, text: str) -> bytes:
        return self._chunk([{"index": 0, "text": text}])

    def role(self) -> bytes:
        return self._delta({"role": "assistant"}) if self.c.chat else b""

    def content(self, i: int) -> bytes:
        """The i-th placeholder content frame of the mode."""
        mode, word = self.spec.mode, PLACEHOLDER_TOKEN
        if mode is FaultMode.MID_REASONING:
            if self.c.chat:
                return self._delta({"reasoning_content": word})
            return self._text(TEXT_REASONING_OPEN if i == 0 else word)
        if mode is FaultMode.MID_TOOL_CALL:
            if not self.c.chat:
                return self._text(TEXT_TOOL_OPEN if i == 0 else word)
            if i == 0:
                return self._delta({"tool_calls": [{
                    "index": 0, "id": TOOL_ID, "type": "function",
                    "function": {"name": TOOL_NAME, "arguments": ""}}]})
            fragment = TOOL_ARGS_OPEN if i == 1 else word
            return self._delta({"tool_calls": [{"index": 0, "function": {"arguments": fragment}}]})
        return self._delta({"content": word}) if self.c.chat else self._text(word)

    def torn(self) -> bytes:
        """The start of the next content frame: half of it, or (utf8) up to and including
        the first byte of a two-byte character."""
        text = UTF8_WORD if self.spec.utf8 else PLACEHOLDER_TOKEN
        full = self._delta({"content": text}) if self.c.chat else self._text(text)
        if self.spec.utf8:
            return full[: next(i for i, b in enumerate(full) if b & 0xC0 == 0xC0) + 1]
        return full[: len(full) // 2]

    def finish(self) -> bytes:
        if self.c.chat:
            return self._chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}])
        return self._chunk([{"index": 0, "text": "", "finish_reason": "stop"}])

    def usage(self, completion_tokens: int) -> bytes:
        c = self.c
        return _sse(json_encode({
            "id": c.id, "object": "chat.completion.chunk" if c.chat else "text_completion",
            "created": c.created, "model": c.model, "choices": [],
            "usage": {"prompt_tokens": self.n_prompt, "completion_tokens": completion_tokens,
                      "total_tokens": self.n_prompt + completion_tokens}}))

    def prepare_stream(self) -> None:
        """For a fault inside a real stream: make the completion's own token frames speak
        the mode (reasoning deltas, tool-call argument fragments), its head open them."""
        mode, c = self.spec.mode, self.c
        if mode is FaultMode.MID_REASONING:
            c.token = self.content(1)
            c.head = (c.head or b"") + (b"" if c.chat else self.content(0))
        elif mode is FaultMode.MID_TOOL_CALL:
            c.token = self.content(2)
            c.head = (c.head or b"") + self.content(0) + (self.content(1) if c.chat else b"")


# ---- ending a connection -------------------------------------------------------------------


async def _drained(request: web.BaseRequest) -> None:
    """Until what was written has left the process, then a short grace for the peer."""
    transport = request.transport
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _DRAIN_LIMIT_S
    while (transport is not None and not transport.is_closing()
           and transport.get_write_buffer_size() and loop.time() < deadline):
        await asyncio.sleep(0.005)
    await asyncio.sleep(FLUSH_GRACE_S)


async def cut(request: web.BaseRequest) -> None:
    """FIN mid-body: the chunked encoding's terminator never comes (curl exit 18)."""
    await _drained(request)
    transport = request.transport
    if transport is not None:
        transport.close()


async def reset(request: web.BaseRequest) -> None:
    """An abortive close: SO_LINGER 0, so the kernel sends RST instead of FIN (curl exit
    56). Falls back to a FIN, logged, when the socket cannot be had."""
    await _drained(request)
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except (AttributeError, OSError) as exc:
        log.warning("reset fault: cannot set SO_LINGER (%s); closing with FIN", exc)
        transport.close()
        return
    transport.abort()


async def stall(request: web.BaseRequest) -> None:
    """Nothing more, the connection held open until the client gives up (curl -m: 28)."""
    transport = request.transport
    while transport is not None and not transport.is_closing():
        await asyncio.sleep(0.25)  # the handler is cancelled at once when the client leaves


# ---- the modes ---------------------------------------------------------------------------


async def fire(request: web.BaseRequest, resp: web.StreamResponse, frames: Frames,
               sent: int) -> None:
    """What happens after the content frames: the mode's ending. `sent` = content
    frames (or tokens) written so far."""
    mode = frames.spec.mode
    log.info("fault %s fired on %s after %d content frames", frames.spec.describe(),
             frames.c.id, sent)
    if mode in (FaultMode.CUT_BETWEEN_FRAMES, FaultMode.MID_REASONING, FaultMode.MID_TOOL_CALL):
        await cut(request)
    elif mode is FaultMode.CUT_MID_FRAME:
        await resp.write(frames.torn())
        await cut(request)
    elif mode is FaultMode.RESET:
        await reset(request)
    elif mode is FaultMode.STALL:
        await stall(request)
    elif mode is FaultMode.ERROR_ENVELOPE_200:
        await resp.write(_sse(OPENROUTER_ERROR) + DONE_FRAME)
    elif mode is FaultMode.ERROR_400_IN_SSE:
        await resp.write(_sse(VLLM_400))
    elif mode is FaultMode.NO_DONE:
        usage = frames.usage(sent) if frames.c.include_usage else b""
        await resp.write(frames.finish() + usage)
    elif mode is FaultMode.NO_USAGE:
        await resp.write(frames.finish() + DONE_FRAME)
    elif mode is FaultMode.CANCELLED_499:
        await resp.write(_sse(DYNAMO_499))


async def scripted(request: web.BaseRequest, resp: web.StreamResponse, frames: Frames) -> None:
    """The engine-free faulting stream: the role frame (chat), `after_chunks` content
    frames `delay_ms` apart, then the mode's ending. Deterministic: no randomness."""
    spec = frames.spec
    delay = spec.delay_ms / 1000
    role = frames.role()
    if role:
        await resp.write(role)
    for i in range(spec.after_chunks):
        await asyncio.sleep(delay)
        await resp.write(frames.content(i))
    await asyncio.sleep(delay)
    await fire(request, resp, frames, spec.after_chunks)


async def serve_scripted(request: web.Request, completion: Completion, spec: FaultSpec,
                         n_prompt: int) -> web.StreamResponse:
    """The scripted faulting stream as a whole response (the engine is not asked)."""
    resp = web.StreamResponse(headers=SSE_HEADERS)
    try:
        await resp.prepare(request)
        await scripted(request, resp, Frames(completion, spec, n_prompt))
    except ConnectionError:
        raise ClientGone() from None
    return resp


def pump_until_fault(spec: FaultSpec) -> Pump:
    """The engine path's pump for a fault with `after_tokens`: the real paced stream up
    to exactly that many tokens (or the engine's finish, if it comes first), then the
    fault's ending instead of the stream's (the engine path's `finally` then cancels the
    engine request, as a client's disconnect would)."""

    async def pump(request: web.Request, stream: RequestStream, completion: Completion,
                   resp: web.StreamResponse, events: list, n_prompt: int) -> None:
        frames = Frames(completion, spec, n_prompt)
        completion.start_stream()
        frames.prepare_stream()
        head = completion.head
        token, limit = completion.token, spec.after_tokens
        streamed = 0
        while True:
            finished = next((e.finished for e in events if e.HasField("finished")), None)
            if finished is not None and (err := finish_error(finished)) is not None:
                raise err
            new = max(min(stream.total, limit) - streamed, 0)
            if new or (finished is not None and head):
                await resp.write(head + token * new)
                head = b""
                streamed += new
            if streamed >= limit or finished is not None:
                await fire(request, resp, frames, streamed)
                return
            events = await stream.next_events()

    return pump
