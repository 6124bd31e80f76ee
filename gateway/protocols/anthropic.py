"""The Anthropic Messages API (`POST /v1/messages`): text, or the tool call a request forces.

Knows: the request body (`model`, `messages` with string or content-block content,
`system`, `max_tokens` required as Anthropic requires it, `stream`; `thread` (server-held
conversation state) is refused with the `thread_unsupported_request` error code, on which
the anthropic SDK resends the whole conversation without it; other fields such as
`temperature`, `metadata` or `stop_sequences` are accepted and ignored), its prompt length
under the lab's tokenizer, the non-streaming `message` object, the streaming event
sequence (`message_start`, `content_block_start`, `ping`, one `content_block_delta` per
token, `content_block_stop`, `message_delta` with `stop_reason` and the cumulative usage,
`message_stop`), and Anthropic's error envelope, as a body and as an `error` event.

A request whose `tool_choice` forces a call ("any", or a named tool) gets a `tool_use`
block instead of text (`ToolUseMessage`; the call from gateway.toolcalls), stop_reason
"tool_use".

`stop_reason` is "max_tokens" when the reply reached the request's `max_tokens` (always,
unless a workload drew a shorter length) and "end_turn" otherwise.

Does not know: aiohttp, gRPC, or the engine's events (`gateway.protocols.generate`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Annotated, Any, Literal

import msgspec

from inference_lab.common.tokenizer import Tokenizer
from inference_lab.gateway.errors import ErrorKind, GatewayError, anthropic_envelope
from inference_lab.gateway.protocols.base import (
    _U31, PLACEHOLDER_TOKEN, Dialect, Generation, Outcome, Reply, decode, event_frame,
    content_text, conversation_ids, json_encode, random_id, raw_text, with_tools, Fraction,
)
from inference_lab.gateway.protocols.reasoning import Split, thinking_share
from inference_lab.gateway.toolcalls import ForcedCall, messages_forced


class ResultBlock(msgspec.Struct):
    """A block of a tool result's content (text counts; images, documents count 0)."""

    type: str
    text: str | None = None

    def words(self) -> str:
        return self.text or ""


class ContentBlock(msgspec.Struct):
    type: str
    text: str | None = None  # text blocks; images and documents from a URL count as 0
    thinking: str | None = None  # a thinking block the client sends back
    name: str | None = None  # tool_use: the tool's name ...
    input: Any = None  # ... and its input, as the model wrote them
    # tool_result: what the tool returned (an object, as server tools' errors, counts 0)
    content: str | list[ResultBlock] | dict | None = None

    def words(self) -> str:
        content = self.content
        return ((self.text or "") + (self.thinking or "") + (self.name or "")
                + raw_text(self.input) + ("" if isinstance(content, dict) else content_text(content)))


class Message(msgspec.Struct):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class MessagesRequest(msgspec.Struct, kw_only=True):
    model: str
    messages: Annotated[list[Message], msgspec.Meta(min_length=1)]
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=_U31)]
    system: str | list[ContentBlock] | None = None
    stream: bool = False
    tools: Any = None  # counted in the prompt, as chat templates render them
    tool_choice: dict[str, Any] | None = None  # "any" or a named tool: a tool_use reply
    # sampling: checked for type and range as Anthropic documents them, otherwise unused
    temperature: Fraction | None = None
    top_p: Fraction | None = None
    top_k: Annotated[int, msgspec.Meta(ge=0)] | None = None
    stop_sequences: list[str] | None = None
    thread: Any = None  # server-held conversation state: not held here (Messages.parse)
    thinking: dict[str, Any] | None = None  # {"type": "enabled", "budget_tokens": N}


_decoder = msgspec.json.Decoder(MessagesRequest)


def parse_request(body: bytes) -> MessagesRequest:
    """A Messages request, checked (its 400 naming the field); no thread held here."""
    req = decode(_decoder, body)
    if req.thread is not None:
        raise no_threads()
    return req


def messages_prompt(tokenizer: Tokenizer, req: MessagesRequest) -> Sequence[int]:
    """The system prompt (as a first message) and the messages, as chat completions
    render a conversation: requests sharing a system prompt share a token prefix."""
    messages = [("system", content_text(req.system))] if req.system is not None else []
    messages += [(m.role, content_text(m.content)) for m in req.messages]
    return conversation_ids(tokenizer, with_tools(messages, req.tools))


class AnthropicMessage(Reply):
    """One request's response: a `message` object, or its event stream."""

    __slots__ = ("id", "model", "prompt_tokens", "max_tokens", "_token", "split", "_thought",
                 "_answering")

    def __init__(self, model: str, prompt_tokens: int, max_tokens: int) -> None:
        self.id = "msg_" + random_id()
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self._token = self._delta(0)
        # thinking enabled on a reasoning model: a thinking block first (index 0, streamed
        # in thinking_delta events, closed by its signature), then the text block (index 1)
        self.split: Split | None = None
        self._thought = b""
        self._answering = True  # the text block is open (thinking over, or none)

    @staticmethod
    def _delta(index: int) -> bytes:
        return event_frame("content_block_delta", {
            "type": "content_block_delta", "index": index,
            "delta": {"type": "text_delta", "text": PLACEHOLDER_TOKEN}})

    def reasoned(self, tokens: int) -> None:
        self.split = Split(tokens)
        self._answering = False
        self._token = self._delta(1)
        self._thought = event_frame("content_block_delta", {
            "type": "content_block_delta", "index": 0,
            "delta": {"type": "thinking_delta", "thinking": PLACEHOLDER_TOKEN}})

    def _signature(self) -> str:
        """The thinking block's signature: opaque, as Anthropic's (a client sends it back)."""
        return "sig_" + self.id

    def _thinking(self, tokens: int) -> dict:
        return {"type": "thinking", "thinking": PLACEHOLDER_TOKEN * tokens,
                "signature": self._signature()}

    def _message(self, text: str, stop_reason: str | None, output_tokens: int) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [{"type": "text", "text": text}] if text or stop_reason else [],
                "stop_reason": stop_reason, "stop_sequence": None,
                "usage": {"input_tokens": self.prompt_tokens, "output_tokens": output_tokens}}

    def _stop_reason(self, count: int) -> str:
        return "max_tokens" if count >= self.max_tokens else "end_turn"

    def opening(self) -> bytes:
        # Goes out with the first token, which is counted in it.
        start = event_frame("message_start", {"type": "message_start",
                                              "message": self._message("", None, 1)})
        if self.split is not None:
            return (start + event_frame("content_block_start", {
                "type": "content_block_start", "index": 0,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""}})
                + event_frame("ping", {"type": "ping"}))
        return (start + self._text_start(0) + event_frame("ping", {"type": "ping"}))

    @staticmethod
    def _text_start(index: int) -> bytes:
        return event_frame("content_block_start", {
            "type": "content_block_start", "index": index,
            "content_block": {"type": "text", "text": ""}})

    def _thought_done(self) -> bytes:
        """The thinking block's end: its signature, then its stop; the text block opens."""
        self._answering = True
        return (event_frame("content_block_delta", {
            "type": "content_block_delta", "index": 0,
            "delta": {"type": "signature_delta", "signature": self._signature()}})
                + event_frame("content_block_stop", {"type": "content_block_stop", "index": 0})
                + self._text_start(1))

    def tokens(self, index: int, k: int) -> bytes:
        if self.split is None:
            return self._token * k
        thinking, k = self.split.take(0, k)
        out = self._thought * thinking
        if k and not self._answering:
            out += self._thought_done()
        return out + self._token * k

    def closing(self, outcome: Outcome) -> bytes:
        count = outcome.completion_tokens
        delta = {"type": "message_delta",
                 "delta": {"stop_reason": self._stop_reason(count), "stop_sequence": None},
                 "usage": {"input_tokens": outcome.prompt_tokens, "output_tokens": count}}
        if outcome.modelled:
            delta["inference_lab"] = outcome.modelled
        head = b"" if self._answering else self._thought_done()  # (thought till the cap)
        last = 0 if self.split is None else 1
        return (head + event_frame("content_block_stop", {"type": "content_block_stop", "index": last})
                + event_frame("message_delta", delta)
                + event_frame("message_stop", {"type": "message_stop"}))

    def body(self, outcome: Outcome) -> bytes:
        count = outcome.completion_tokens
        thinking = 0 if self.split is None else self.split.of(count)
        message = self._message(PLACEHOLDER_TOKEN * (count - thinking), self._stop_reason(count), count)
        if self.split is not None:
            message["content"].insert(0, self._thinking(thinking))
        message["usage"]["input_tokens"] = outcome.prompt_tokens
        if outcome.modelled:
            message["inference_lab"] = outcome.modelled
        return json_encode(message)

    def error_frame(self, err: GatewayError) -> bytes:
        return b"event: error\ndata: " + anthropic_envelope(err) + b"\n\n"


class ToolUseMessage(AnthropicMessage):
    """A message that is the one tool call the request forced (`tool_choice` "any" or a
    named tool): a `tool_use` block (id "toolu_...", name, input), stop_reason "tool_use".
    Streamed: `content_block_start` with the block and an empty input, then one
    `input_json_delta` per token (the first with the input's opening text), the closing
    text in one more before `content_block_stop`. The input follows the engine's token
    count (gateway.toolcalls.arguments), so the call is always whole: never "max_tokens"."""

    __slots__ = ("call", "block_id", "_started")

    def __init__(self, model: str, prompt_tokens: int, max_tokens: int, call: ForcedCall) -> None:
        super().__init__(model, prompt_tokens, max_tokens)
        self.call = call
        self.block_id = "toolu_" + random_id()[:24]
        self._started = False  # whether the input's opening text went out
        self._token = self._input(call.arguments.fragment)

    def _input(self, text: str) -> bytes:
        return event_frame("content_block_delta", {
            "type": "content_block_delta", "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": text}})

    def _block(self, tokens: int | None) -> dict:
        value = {} if tokens is None else self.call.arguments.value(tokens)
        return {"type": "tool_use", "id": self.block_id, "name": self.call.name, "input": value}

    def opening(self) -> bytes:
        start = self._message("", None, 1)
        start["content"] = []
        return (event_frame("message_start", {"type": "message_start", "message": start})
                + event_frame("content_block_start", {"type": "content_block_start", "index": 0,
                                                      "content_block": self._block(None)})
                + event_frame("ping", {"type": "ping"}))

    def tokens(self, index: int, k: int) -> bytes:
        if self._started or k <= 0:
            return self._token * k
        self._started = True
        args = self.call.arguments
        return self._input(args.prefix + args.fragment) + self._token * (k - 1)

    def _stop_reason(self, count: int) -> str:
        return "tool_use"

    def closing(self, outcome: Outcome) -> bytes:
        args = self.call.arguments
        rest = self._input(args.suffix if self._started else args.prefix + args.suffix)
        return rest + super().closing(outcome)

    def body(self, outcome: Outcome) -> bytes:
        count = outcome.completion_tokens
        message = self._message("", "tool_use", count)
        message["content"] = [self._block(count)]
        message["usage"]["input_tokens"] = outcome.prompt_tokens
        if outcome.modelled:
            message["inference_lab"] = outcome.modelled
        return json_encode(message)


# The anthropic SDK's threads (`thread: {"type": "create" | "continue"}`, which its
# `beta.messages.tool_runner` sends by default) send later turns without the history the
# server would hold; on this refusal (its error_code) the SDK sends the whole conversation
# without `thread` instead.
def no_threads() -> GatewayError:
    return GatewayError(
        ErrorKind.INVALID_REQUEST,
        "Invalid request body: this server holds no Threads (server-held conversation "
        "state); send the full conversation without `thread` - at `$.thread`",
        details={"error_code": "thread_unsupported_request"})


class Messages(Dialect):
    name = "anthropic.messages"
    api = "Messages"

    def parse(self, body: bytes, tokenizer: Tokenizer) -> Generation:
        req = parse_request(body)
        prompt = messages_prompt(tokenizer, req)
        call = messages_forced(req.tools, req.tool_choice, 0, PLACEHOLDER_TOKEN)
        share = thinking_share(req.thinking, req.max_tokens)
        if call is not None:
            reply = partial(ToolUseMessage, req.model, len(prompt), req.max_tokens, call)
            share = 0.0  # (a forced call's reply is the call alone)
        else:
            reply = partial(AnthropicMessage, req.model, len(prompt), req.max_tokens)
        return Generation(req.model, prompt, req.max_tokens, req.stream, reply, reasoning=share)

    def error_body(self, err: GatewayError) -> bytes:
        return anthropic_envelope(err)


MESSAGES = Messages()
