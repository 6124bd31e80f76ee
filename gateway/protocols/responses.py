"""The OpenAI Responses API (`POST /v1/responses`), text only.

Knows: the request body (`model`, `input` as a string or a list of message items whose
content is a string or text parts, `instructions`, `max_output_tokens`, `stream`; other
fields such as `temperature`, `store` or `metadata` are accepted and ignored), its prompt
length under the lab's tokenizer, the `response` object, and the typed stream:
`response.created`, `response.in_progress`, `response.output_item.added`,
`response.content_part.added`, one `response.output_text.delta` per token, then
`response.output_text.done`, `response.content_part.done`, `response.output_item.done` and
`response.completed` with usage. Every event carries its `sequence_number`.

As OpenAI does, a response that reached the request's `max_output_tokens` is
`"status": "incomplete"` with `incomplete_details.reason = "max_output_tokens"` (its
stream ends with `response.incomplete`); without an explicit cap the length is the lab's
default or a workload draw and the response is `completed`. A failure after the stream
began is an `error` event followed by `response.failed`. Errors before it use the OpenAI
envelope, as chat completions do.

Does not know: aiohttp, gRPC, or the engine's events (`gateway.protocols.generate`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Annotated

import msgspec

from inference_lab.common.tokenizer import Tokenizer
from inference_lab.gateway.errors import GatewayError
from inference_lab.gateway.protocols.base import (
    _U31, PLACEHOLDER_TOKEN, Dialect, Generation, Outcome, Reply, decode, event_frame,
    conversation_ids, invalid, json_encode, random_id,
)


class InputPart(msgspec.Struct):
    type: str
    text: str | None = None  # input_text / output_text; other kinds count as 0


class InputItem(msgspec.Struct):
    role: str
    content: str | list[InputPart]
    type: str = "message"


class ResponsesRequest(msgspec.Struct, kw_only=True):
    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: Annotated[int, msgspec.Meta(ge=1, le=_U31)] | None = None
    stream: bool = False


_decoder = msgspec.json.Decoder(ResponsesRequest)


def input_prompt(tokenizer: Tokenizer, req: ResponsesRequest) -> Sequence[int]:
    """The instructions (as a first system message) and the input (a string is one user
    message), as chat completions render a conversation."""
    messages = [("system", req.instructions)] if req.instructions is not None else []
    if isinstance(req.input, str):
        messages.append(("user", req.input))
    else:
        if not req.input:
            raise invalid("`input` must not be empty - at `$.input`")
        for i, item in enumerate(req.input):
            if item.type != "message":
                raise invalid(f"Only message input items are supported (text only), got "
                              f"{item.type!r} - at `$.input[{i}].type`")
            content = item.content
            text = content if isinstance(content, str) else "".join(
                part.text for part in content if part.text)
            messages.append((item.role or "user", text))
    return conversation_ids(tokenizer, messages)


def _usage(outcome: Outcome) -> dict:
    prompt, output = outcome.prompt_tokens, outcome.completion_tokens
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": outcome.cached_tokens},
            "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + output}


class Response(Reply):
    """One request's `response` object, or its typed event stream."""

    __slots__ = ("id", "item_id", "created_at", "model", "instructions", "max_output_tokens",
                 "_seq", "_delta_head")

    def __init__(self, model: str, instructions: str | None, max_output_tokens: int | None):
        self.id = "resp_" + random_id()
        self.item_id = "msg_" + random_id()
        self.created_at = int(time.time())
        self.model = model
        self.instructions = instructions
        self.max_output_tokens = max_output_tokens
        self._seq = 0  # the next event's sequence_number
        delta = {"type": "response.output_text.delta", "item_id": self.item_id,
                 "output_index": 0, "content_index": 0, "delta": PLACEHOLDER_TOKEN,
                 "logprobs": [], "sequence_number": 0}
        head = event_frame(delta["type"], delta)
        # Everything up to the sequence number; each delta is head + number + "}\n\n".
        self._delta_head = head[:head.rindex(b"0}")]

    # ---- the object ------------------------------------------------------------------
    def _status(self, count: int) -> str:
        cap = self.max_output_tokens
        return "incomplete" if cap is not None and count >= cap else "completed"

    def _part(self, text: str) -> dict:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _item(self, text: str | None, status: str) -> dict:
        return {"type": "message", "id": self.item_id, "status": status, "role": "assistant",
                "content": [] if text is None else [self._part(text)]}

    def _response(self, status: str, output: list, usage: dict | None = None,
                  error: dict | None = None) -> dict:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {"id": self.id, "object": "response", "created_at": self.created_at,
                "status": status, "error": error, "incomplete_details": incomplete,
                "instructions": self.instructions, "max_output_tokens": self.max_output_tokens,
                "model": self.model, "output": output, "parallel_tool_calls": True,
                "temperature": 1.0, "top_p": 1.0, "tool_choice": "auto", "tools": [],
                "text": {"format": {"type": "text"}}, "truncation": "disabled",
                "metadata": {}, "usage": usage}

    def _finished(self, outcome: Outcome) -> tuple[str, str, dict]:
        count = outcome.completion_tokens
        status = self._status(count)
        text = PLACEHOLDER_TOKEN * count
        return status, text, self._item(text, status)

    # ---- the stream --------------------------------------------------------------------
    def _event(self, name: str, fields: dict) -> bytes:
        seq, self._seq = self._seq, self._seq + 1
        return event_frame(name, {"type": name, **fields, "sequence_number": seq})

    def opening(self) -> bytes:
        return (self._event("response.created", {"response": self._response("in_progress", [])})
                + self._event("response.in_progress",
                              {"response": self._response("in_progress", [])})
                + self._event("response.output_item.added",
                              {"output_index": 0, "item": self._item(None, "in_progress")})
                + self._event("response.content_part.added",
                              {"item_id": self.item_id, "output_index": 0, "content_index": 0,
                               "part": self._part("")}))

    def tokens(self, index: int, k: int) -> bytes:
        seq = self._seq
        self._seq = seq + k
        head = self._delta_head
        return b"".join(b"%s%d}\n\n" % (head, s) for s in range(seq, seq + k))

    def closing(self, outcome: Outcome) -> bytes:
        status, text, item = self._finished(outcome)
        where = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        response = self._response(status, [item],
                                  _usage(outcome))
        if outcome.modelled:
            response["inference_lab"] = outcome.modelled
        return (self._event("response.output_text.done", {**where, "text": text, "logprobs": []})
                + self._event("response.content_part.done", {**where, "part": self._part(text)})
                + self._event("response.output_item.done", {"output_index": 0, "item": item})
                + self._event(f"response.{status}", {"response": response}))

    def body(self, outcome: Outcome) -> bytes:
        status, _, item = self._finished(outcome)
        response = self._response(status, [item],
                                  _usage(outcome))
        if outcome.modelled:
            response["inference_lab"] = outcome.modelled
        return json_encode(response)

    def error_frame(self, err: GatewayError) -> bytes:
        spec = err.spec
        error = {"code": spec.code, "message": err.message}
        return (self._event("error", {**error, "param": None})
                + self._event("response.failed",
                              {"response": self._response("failed", [], error=error)}))


class Responses(Dialect):
    name = "openai.responses"

    def parse(self, body: bytes, tokenizer: Tokenizer) -> Generation:
        req = decode(_decoder, body)
        reply = Response(req.model, req.instructions, req.max_output_tokens)
        return Generation(req.model, input_prompt(tokenizer, req), req.max_output_tokens, req.stream,
                          reply)


RESPONSES = Responses()
