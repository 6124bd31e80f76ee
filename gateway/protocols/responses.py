"""The OpenAI Responses API (`POST /v1/responses`): text, or the tool call a request forces.

Knows: the request body (`model`, `input` as a string or a list of items: messages whose
content is a string or text parts, and an agent loop's function_call, function_call_output
and reasoning items; `instructions`, `max_output_tokens`, `stream`, `tools` (counted),
`previous_response_id` and `store`; other fields such as `temperature` or `metadata` are
accepted and ignored), its prompt length under the lab's tokenizer, the conversations of
finished responses (`STORE`, in memory, for `previous_response_id`), the `response` object, and the typed stream:
`response.created`, `response.in_progress`, `response.output_item.added`,
`response.content_part.added`, one `response.output_text.delta` per token, then
`response.output_text.done`, `response.content_part.done`, `response.output_item.done` and
`response.completed` with usage. Every event carries its `sequence_number`.
A request whose `tool_choice` forces a call ("required", or a named function) gets a
`function_call` output item instead of a message (`FunctionCallResponse`; the call from
gateway.toolcalls). The `response` object echoes the request's `tools` and `tool_choice`.

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
from collections import OrderedDict
from collections.abc import Sequence
from functools import partial
from typing import Annotated, Any

import msgspec

from inference_lab.common.tokenizer import Tokenizer
from inference_lab.gateway.errors import ErrorKind, GatewayError
from inference_lab.gateway.protocols.base import (
    _U31, PLACEHOLDER_TOKEN, Dialect, Generation, Outcome, Reply, decode, event_frame,
    content_text, conversation_ids, invalid, json_encode, random_id, with_tools, Fraction, NonNegative,
)
from inference_lab.gateway.protocols.reasoning import Split, effort_share
from inference_lab.gateway.toolcalls import ForcedCall, responses_forced


class InputPart(msgspec.Struct):
    type: str
    text: str | None = None  # input_text / output_text / summary_text; others count as 0

    def words(self) -> str:
        return self.text or ""


class InputItem(msgspec.Struct):
    """An input item: a message (role, content), or what an agent loop sends back: a
    function_call (name, arguments), its function_call_output (output), a reasoning item
    (summary); other kinds (item_reference, ...) are accepted and count as 0 tokens."""

    type: str = "message"
    role: str | None = None
    content: str | list[InputPart] | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[InputPart] | None = None
    summary: list[InputPart] | None = None


class ResponsesRequest(msgspec.Struct, kw_only=True):
    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: Annotated[int, msgspec.Meta(ge=1, le=_U31)] | None = None
    stream: bool | None = False  # null = false
    previous_response_id: str | None = None  # continue that response's conversation
    store: bool | None = True  # keep this one for a later previous_response_id
    # sampling: checked for type and range, otherwise unused
    temperature: NonNegative | None = None
    top_p: Fraction | None = None
    user: str | None = None
    tools: Any = None  # counted in the prompt, as chat templates render them
    tool_choice: str | dict[str, Any] | None = None  # "required" or a named one: a function_call
    reasoning: dict[str, Any] | None = None  # {"effort": ...}: a reasoning model's share


_decoder = msgspec.json.Decoder(ResponsesRequest)


class ResponseStore:
    """The conversations of finished responses (input and output, without instructions,
    which OpenAI does not carry over), for `previous_response_id`, and each response as
    GET /v1/responses/{id} answers it (its JSON bytes: what is held is what is counted,
    tools and instructions included); the oldest go first once more than `max_bytes` or
    `max_items` responses are held. In memory: a restart forgets them, as it forgets
    everything else of a request."""

    ITEM_BYTES = 64  # counted for each conversation message beyond its text (the objects)

    def __init__(self, max_bytes: int = 64 << 20, max_items: int = 100_000) -> None:
        self.max_bytes, self.max_items = max_bytes, max_items
        self._items: OrderedDict[str, tuple[list[tuple[str, str]], int, bytes]] = OrderedDict()
        self.bytes = 0  # counted size of everything held

    def put(self, rid: str, conversation: list[tuple[str, str]], response: dict) -> None:
        """Keep a finished response: its conversation and its `response` object (what
        GET /v1/responses/{id} answers, kept encoded)."""
        body = json_encode(response)
        size = len(body) + sum(len(role) + len(text) + self.ITEM_BYTES
                               for role, text in conversation)
        old = self._items.pop(rid, None)
        if old is not None:
            self.bytes -= old[1]
        self._items[rid] = (conversation, size, body)
        self.bytes += size
        while self._items and (self.bytes > self.max_bytes or len(self._items) > self.max_items):
            _, (_, gone, _) = self._items.popitem(last=False)
            self.bytes -= gone

    def __len__(self) -> int:
        return len(self._items)

    def get(self, rid: str) -> list[tuple[str, str]] | None:
        found = self._items.get(rid)
        return None if found is None else found[0]

    def response(self, rid: str) -> bytes | None:
        """The stored response's JSON."""
        found = self._items.get(rid)
        return None if found is None else found[2]

    def delete(self, rid: str) -> bool:
        found = self._items.pop(rid, None)
        if found is not None:
            self.bytes -= found[1]
        return found is not None


STORE = ResponseStore()


def input_conversation(req: ResponsesRequest) -> list[tuple[str, str]]:
    """The previous response's conversation (if `previous_response_id`; 404 when this
    gateway holds none of that id) and this request's input (a string is one user message)."""
    conversation: list[tuple[str, str]] = []
    if req.previous_response_id is not None:
        previous = STORE.get(req.previous_response_id)
        if previous is None:
            raise GatewayError(ErrorKind.PREVIOUS_RESPONSE_NOT_FOUND,
                               f"Previous response with id '{req.previous_response_id}' not "
                               "found. - at `$.previous_response_id`")
        conversation += previous
    if isinstance(req.input, str):
        conversation.append(("user", req.input))
    else:
        if not req.input:
            raise invalid("`input` must not be empty - at `$.input`")
        for i, item in enumerate(req.input):
            conversation.append(_item_message(item, i))
    return conversation


def input_prompt(tokenizer: Tokenizer, req: ResponsesRequest,
                 conversation: list[tuple[str, str]] | None = None) -> Sequence[int]:
    """The tool definitions, the instructions (as a first system message) and the
    conversation, as chat completions render one."""
    messages = [("system", req.instructions)] if req.instructions is not None else []
    messages += input_conversation(req) if conversation is None else conversation
    return conversation_ids(tokenizer, with_tools(messages, req.tools))


def _item_message(item: InputItem, i: int) -> tuple[str, str]:
    """(role, text) of one input item, as the model would read it."""
    kind = item.type
    if kind == "message":
        for key in ("role", "content"):
            if getattr(item, key) is None:
                raise invalid(f"Invalid request body: Object missing required field `{key}` "
                              f"- at `$.input[{i}]`")
        return item.role, content_text(item.content)
    if kind == "function_call":
        return "assistant", (item.name or "") + (item.arguments or "")
    if kind == "function_call_output":
        return "tool", content_text(item.output)
    if kind == "reasoning":
        return "assistant", content_text(item.summary) + content_text(item.content)
    return item.role or kind, content_text(item.content)


def _usage(outcome: Outcome, reasoning: int = 0) -> dict:
    prompt, output = outcome.prompt_tokens, outcome.completion_tokens
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": outcome.cached_tokens},
            "output_tokens": output, "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": prompt + output}


class Response(Reply):
    """One request's `response` object, or its typed event stream."""

    __slots__ = ("id", "item_id", "created_at", "model", "instructions", "max_output_tokens",
                 "_seq", "_delta_head", "previous_response_id", "conversation", "tools",
                 "tool_choice", "split", "reasoning_id", "_thought_head", "_answering")

    def __init__(self, model: str, instructions: str | None, max_output_tokens: int | None,
                 previous_response_id: str | None = None,
                 conversation: list[tuple[str, str]] | None = None,
                 tools: Any = None, tool_choice: Any = None):
        self.tools = tools if isinstance(tools, list) else []  # echoed, as OpenAI does
        self.tool_choice = tool_choice if tool_choice is not None else "auto"
        self.previous_response_id = previous_response_id
        # stored with the output once finished, for a later previous_response_id (None:
        # the request said store: false)
        self.conversation = conversation
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
        # a reasoning model's reply: a reasoning item first (output 0, its text streamed
        # in response.reasoning_text.delta events), then the message (output 1)
        self.split: Split | None = None
        self.reasoning_id = ""
        self._thought_head = b""
        self._answering = True  # the message item is open (reasoning over, or none)

    def reasoned(self, tokens: int) -> None:
        self.split = Split(tokens)
        self.reasoning_id = "rs_" + random_id()
        self._answering = False
        self._delta_head = self._head("response.output_text.delta", self.item_id, 1)
        self._thought_head = self._head("response.reasoning_text.delta", self.reasoning_id, 0)

    @staticmethod
    def _head(name: str, item_id: str, output_index: int) -> bytes:
        delta = {"type": name, "item_id": item_id, "output_index": output_index,
                 "content_index": 0, "delta": PLACEHOLDER_TOKEN, "logprobs": [],
                 "sequence_number": 0}
        head = event_frame(name, delta)
        return head[:head.rindex(b"0}")]

    @property
    def _index(self) -> int:
        """The message item's output index (after the reasoning item, when there is one)."""
        return 0 if self.split is None else 1

    def _thinking(self, tokens: int, status: str) -> dict:
        return {"type": "reasoning", "id": self.reasoning_id, "summary": [],
                "content": [{"type": "reasoning_text", "text": PLACEHOLDER_TOKEN * tokens}],
                "encrypted_content": None, "status": status}

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
                "temperature": 1.0, "top_p": 1.0, "tool_choice": self.tool_choice, "tools": self.tools,
                "text": {"format": {"type": "text"}}, "truncation": "disabled",
                "metadata": {}, "usage": usage,
                "previous_response_id": self.previous_response_id}

    def _finished(self, outcome: Outcome) -> tuple[str, str, dict]:
        count = outcome.completion_tokens
        status = self._status(count)
        text = PLACEHOLDER_TOKEN * (count - self._reasoning(outcome))
        return status, text, self._item(text, status)

    def _reasoning(self, outcome: Outcome) -> int:
        return 0 if self.split is None else self.split.of(outcome.completion_tokens)

    def _keep(self, response: dict, text: str) -> None:
        """Store the finished response (unless the request said store: false)."""
        if self.conversation is not None:
            STORE.put(self.id, [*self.conversation, ("assistant", text)], response)

    # ---- the stream --------------------------------------------------------------------
    def _event(self, name: str, fields: dict) -> bytes:
        seq, self._seq = self._seq, self._seq + 1
        return event_frame(name, {"type": name, **fields, "sequence_number": seq})

    def opening(self) -> bytes:
        out = (self._event("response.created", {"response": self._response("in_progress", [])})
               + self._event("response.in_progress",
                             {"response": self._response("in_progress", [])}))
        if self.split is not None:
            thought = self._thinking(0, "in_progress")
            thought["content"] = []
            return (out + self._event("response.output_item.added",
                                      {"output_index": 0, "item": thought})
                    + self._event("response.content_part.added", {
                        "item_id": self.reasoning_id, "output_index": 0, "content_index": 0,
                        "part": {"type": "reasoning_text", "text": ""}}))
        return out + self._answer()

    def _answer(self) -> bytes:
        """The message item's opening events."""
        self._answering = True
        index = self._index
        return (self._event("response.output_item.added",
                            {"output_index": index, "item": self._item(None, "in_progress")})
                + self._event("response.content_part.added",
                              {"item_id": self.item_id, "output_index": index, "content_index": 0,
                               "part": self._part("")}))

    def _thought_done(self) -> bytes:
        """The reasoning item's closing events (all of it was streamed by now)."""
        tokens = self.split.reasoning
        text = PLACEHOLDER_TOKEN * tokens
        where = {"item_id": self.reasoning_id, "output_index": 0, "content_index": 0}
        return (self._event("response.reasoning_text.done", {**where, "text": text})
                + self._event("response.content_part.done",
                              {**where, "part": {"type": "reasoning_text", "text": text}})
                + self._event("response.output_item.done",
                              {"output_index": 0, "item": self._thinking(tokens, "completed")}))

    def _deltas(self, head: bytes, k: int) -> bytes:
        seq = self._seq
        self._seq = seq + k
        return b"".join(b"%s%d}\n\n" % (head, s) for s in range(seq, seq + k))

    def tokens(self, index: int, k: int) -> bytes:
        if self.split is None:
            return self._deltas(self._delta_head, k)
        thinking, k = self.split.take(0, k)
        out = self._deltas(self._thought_head, thinking) if thinking else b""
        if k and not self._answering:
            out += self._thought_done() + self._answer()
        return out + self._deltas(self._delta_head, k) if k else out

    def _done(self, outcome: Outcome) -> tuple[str, str, dict, dict]:
        """The finished response (stored unless store: false): its status, text, output
        item and `response` object."""
        status, text, item = self._finished(outcome)
        reasoning = self._reasoning(outcome)
        output = [item] if self.split is None else [
            self._thinking(reasoning, "completed"), item]
        response = self._response(status, output, _usage(outcome, reasoning))
        if outcome.modelled:
            response["inference_lab"] = outcome.modelled
        self._keep(response, text)
        return status, text, item, response

    def closing(self, outcome: Outcome) -> bytes:
        head = b""
        if not self._answering:  # every token was reasoning: close it, open an empty message
            self.split.reasoning = self.split.of(outcome.completion_tokens)
            head = self._thought_done() + self._answer()
        status, text, item, response = self._done(outcome)
        index = self._index
        where = {"item_id": self.item_id, "output_index": index, "content_index": 0}
        return (head + self._event("response.output_text.done",
                                   {**where, "text": text, "logprobs": []})
                + self._event("response.content_part.done", {**where, "part": self._part(text)})
                + self._event("response.output_item.done", {"output_index": index, "item": item})
                + self._event(f"response.{status}", {"response": response}))

    def body(self, outcome: Outcome) -> bytes:
        return json_encode(self._done(outcome)[3])

    def error_frame(self, err: GatewayError) -> bytes:
        spec = err.spec
        error = {"code": spec.code, "message": err.message}
        return (self._event("error", {**error, "param": None})
                + self._event("response.failed",
                              {"response": self._response("failed", [], error=error)}))


class FunctionCallResponse(Response):
    """A response whose output is the one function call the request forced (`tool_choice`
    "required" or a named function): a `function_call` item (id "fc_...", call_id, name,
    arguments, status). Streamed: `response.output_item.added` with empty arguments, one
    `response.function_call_arguments.delta` per token (the first with the arguments'
    opening text), the closing text in one more delta, then
    `response.function_call_arguments.done`, `response.output_item.done`,
    `response.completed`. The arguments follow the engine's token count
    (gateway.toolcalls.arguments), so the call is always whole: `completed`, never
    `incomplete`."""

    __slots__ = ("call", "call_id", "_started")

    def __init__(self, model: str, instructions: str | None, max_output_tokens: int | None,
                 previous_response_id: str | None, conversation: list[tuple[str, str]] | None,
                 tools: Any, tool_choice: Any, call: ForcedCall):
        super().__init__(model, instructions, max_output_tokens, previous_response_id,
                         conversation, tools, tool_choice)
        self.call = call
        self.item_id = "fc_" + random_id()
        self.call_id = "call_" + random_id()[:24]
        self._started = False  # whether the arguments' opening text went out
        delta = {"type": "response.function_call_arguments.delta", "item_id": self.item_id,
                 "output_index": 0, "delta": call.arguments.fragment, "sequence_number": 0}
        head = event_frame(delta["type"], delta)
        self._delta_head = head[:head.rindex(b"0}")]

    def _status(self, count: int) -> str:
        return "completed"

    def _item(self, arguments: str | None, status: str) -> dict:
        return {"type": "function_call", "id": self.item_id, "call_id": self.call_id,
                "name": self.call.name, "arguments": arguments or "", "status": status}

    def _finished(self, outcome: Outcome) -> tuple[str, str, dict]:
        arguments = self.call.arguments.text(outcome.completion_tokens)
        return "completed", arguments, self._item(arguments, "completed")

    def _keep(self, response: dict, text: str) -> None:
        super()._keep(response, self.call.name + text)  # the model wrote its name and arguments

    def _arguments(self, text: str) -> bytes:
        return self._event("response.function_call_arguments.delta",
                           {"item_id": self.item_id, "output_index": 0, "delta": text})

    def opening(self) -> bytes:
        return (self._event("response.created", {"response": self._response("in_progress", [])})
                + self._event("response.in_progress",
                              {"response": self._response("in_progress", [])})
                + self._event("response.output_item.added",
                              {"output_index": 0, "item": self._item(None, "in_progress")}))

    def tokens(self, index: int, k: int) -> bytes:
        if self._started or k <= 0:
            return super().tokens(index, k)
        self._started = True
        args = self.call.arguments
        return self._arguments(args.prefix + args.fragment) + super().tokens(index, k - 1)

    def closing(self, outcome: Outcome) -> bytes:
        status, arguments, item, response = self._done(outcome)
        args = self.call.arguments
        where = {"item_id": self.item_id, "output_index": 0}
        return (self._arguments(args.suffix if self._started else args.prefix + args.suffix)
                + self._event("response.function_call_arguments.done",
                              {**where, "name": self.call.name, "arguments": arguments})
                + self._event("response.output_item.done", {"output_index": 0, "item": item})
                + self._event(f"response.{status}", {"response": response}))


class Responses(Dialect):
    name = "openai.responses"
    api = "Responses"

    def parse(self, body: bytes, tokenizer: Tokenizer) -> Generation:
        req = decode(_decoder, body)
        conversation = input_conversation(req)
        call = responses_forced(req.tools, req.tool_choice, 0, PLACEHOLDER_TOKEN)
        kept = conversation if req.store is not False else None
        effort = (req.reasoning or {}).get("effort")
        share = effort_share(effort if isinstance(effort, str) or effort is None else repr(effort),
                             "$.reasoning.effort")
        if call is not None:
            reply = partial(FunctionCallResponse, req.model, req.instructions,
                            req.max_output_tokens, req.previous_response_id, kept, req.tools,
                            req.tool_choice, call)
            share = 0.0  # (a forced call's reply is the call alone)
        else:
            reply = partial(Response, req.model, req.instructions, req.max_output_tokens,
                            req.previous_response_id, kept, req.tools, req.tool_choice)
        return Generation(req.model, input_prompt(tokenizer, req, conversation),
                          req.max_output_tokens, bool(req.stream), reply, reasoning=share)


RESPONSES = Responses()
