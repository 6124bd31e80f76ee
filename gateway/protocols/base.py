"""What every API dialect shares: the contract between a dialect and the engine path.

Knows: `Generation`, what a dialect makes of a request body (the model, the prompt length,
the explicit output cap, how many sequences, streaming or not) together with its `Reply`,
the object that renders that request's response bytes (made on first use); `Batch` and
its `BatchReply`, the same for a request of several prompts (completions); `Outcome`,
what the engine reported when the request finished; the prompt as token IDs under the
configured tokenizer (the engine hashes them for prefix caching; every generated token is
the same placeholder text); and the SSE framing. (How many tokens a request without max_tokens generates is
the engine's to choose: engine.sim.lengths.)

Does not know: aiohttp, gRPC or the engine's events (`gateway.protocols.generate` turns
those into calls of a Reply), nor any one API's shapes (one module per dialect).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from collections.abc import Callable, Iterator, Sequence

from typing import Annotated, Any

import msgspec

from inference_lab.common.tokenizer import Tokenizer
from inference_lab.gateway.errors import ErrorKind, GatewayError, envelope

# One JSON library for the whole gateway.
json_encode = msgspec.json.Encoder().encode

PLACEHOLDER_TOKEN = " token"  # the text of every simulated token
_U31 = 2**31 - 1


_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48)) & ((1 << 128) - 1)  # version, variant bits
_UUID4_SET = (4 << 76) | (0x8000 << 48)  # version 4, RFC 4122 variant


def random_id() -> str:
    """A random UUID4 as 32 hex digits, what `uuid.uuid4().hex` returns, at a third of its
    cost (no UUID object): a response id and an `x-request-id` for every request, refusals
    included."""
    return "%032x" % (int.from_bytes(os.urandom(16), "big") & _UUID4_CLEAR | _UUID4_SET)


# Sampling parameters: checked for type and range as vLLM checks them (a 400 naming the
# field), then not used, since every generated token is the same placeholder.
NonNegative = Annotated[float, msgspec.Meta(ge=0)]
Fraction = Annotated[float, msgspec.Meta(ge=0, le=1)]
Penalty = Annotated[float, msgspec.Meta(ge=-2, le=2)]


NESTED_TOO_DEEPLY = "Invalid JSON body: nested too deeply"
NOT_UTF8 = "Invalid JSON body: a string is not valid UTF-8"


def invalid(message: str) -> GatewayError:
    return GatewayError(ErrorKind.INVALID_REQUEST, message)


_U32 = 2**32 - 1
_MAX_QUERY_TEXT = 1024  # characters of a text query parameter (a model name)


def query_index(query, name: str, most: int = _U32) -> int | None:
    """Query parameter `name` as an index (ASCII digits, 0..most), None when absent; a
    400 naming it otherwise (never a 500: `int()` takes other digits and any size)."""
    text = query.get(name)
    if text is None:
        return None
    if not (text.isascii() and text.isdigit()) or len(text) > 20 or int(text) > most:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise invalid(f"{name} must be an integer from 0 to {most}, got {shown!r} - at `?{name}`")
    return int(text)


def query_text(query, name: str) -> str | None:
    """Query parameter `name` as text (None when absent or empty); a 400 when it is longer
    than _MAX_QUERY_TEXT or holds what protobuf cannot carry (undecodable bytes)."""
    text = query.get(name) or None
    if text is None:
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise invalid(f"{name} is not valid UTF-8 - at `?{name}`") from None
    if len(text) > _MAX_QUERY_TEXT:
        raise invalid(f"{name} must be at most {_MAX_QUERY_TEXT} characters - at `?{name}`")
    return text


def decode(decoder: msgspec.json.Decoder, body: bytes, what: str = "request body",
           expected: str = ""):
    """Parse and validate a body with a msgspec decoder; GatewayError(invalid_request)
    names the field (msgspec's message carries its JSON path), then says `expected`."""
    if not body:
        raise invalid(f"Invalid {what}: expected a JSON object, got an empty body")
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise invalid(f"Invalid {what}: {exc}" + (f". {expected}" if expected else "")) from None
    except msgspec.DecodeError as exc:
        raise invalid(f"Invalid JSON body: {exc}") from None
    except UnicodeDecodeError:  # (older msgspec raises it for a string that is not UTF-8)
        raise invalid(NOT_UTF8) from None
    except RecursionError:  # msgspec nests as deep as the JSON does, even in ignored fields
        raise invalid(NESTED_TOO_DEEPLY) from None


# ---- the prompt as token IDs (the engine hashes them for prefix caching) -------------------

BOS = 0xFFFFFF00  # stands for an empty text prompt, so that every prompt has a token
_U32_LIMIT = 2**32


def text_ids(tokenizer: Tokenizer, text: str) -> Sequence[int]:
    """A text prompt's token IDs (at least one)."""
    ids = tokenizer.encode(text)
    return ids if len(ids) else (BOS,)


def content_text(content) -> str:
    """A message's text: a string, or the text of its parts (OpenAI content parts and
    Anthropic content blocks alike: each part's `words()`, its text and whatever else of
    it a model would read: a tool call's name and arguments, a tool result, a thinking
    block); None is empty."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.words() for part in content)


def raw_text(value: Any) -> str:
    """A JSON value the model reads (tool definitions, a tool call's input), as compact
    JSON whatever spacing the client sent, so that its count does not depend on the client."""
    return json_encode(value).decode() if value is not None else ""


def with_tools(messages: list[tuple[str, str]], tools: Any) -> list[tuple[str, str]]:
    """The request's tool definitions, as chat templates render them: their JSON, before
    the conversation (so every turn of an agent shares that prefix)."""
    return [("tools", raw_text(tools)), *messages] if tools is not None else messages


def conversation_ids(tokenizer: Tokenizer, messages: list[tuple[str, str]]) -> Sequence[int]:
    """A conversation of (role, text) messages, rendered with its reply's priming
    (inference_lab.common.tokenizer says how). Under the built-in tokenizer that is, per
    message, 3 + ceil(content bytes / 4) tokens, plus 3."""
    return tokenizer.encode_chat(messages)


def checked_ids(ids: list[int], where: str) -> list[int]:
    """Token IDs given by the client: each must fit in 32 bits."""
    for i, tid in enumerate(ids):
        if not 0 <= tid < _U32_LIMIT:
            raise invalid(f"token ids must be in [0, 2^32), got {tid} - at `{where}[{i}]`")
    return ids


# ---- what the engine reported, and what a dialect renders -------------------------------


@dataclass(slots=True)
class Outcome:
    """A finished request: prompt tokens, each sequence's generated tokens, and the
    engine's modelled timings (empty when it gave none)."""

    prompt_tokens: int
    counts: list[int]
    modelled: dict[str, float] = field(default_factory=dict)
    cached_tokens: int = 0  # prompt tokens the engine found in its prefix cache
    kv_transfer_params: dict | None = None  # a remote-decode prefill's handoff (P/D)

    @property
    def completion_tokens(self) -> int:
        return sum(self.counts)


def modelled_timings(finished) -> dict[str, float]:
    """The engine's modelled (simulated) times of a finished request, in seconds: what
    the modelled GPU would have shown, for clients to compare with what they measured."""
    return {"queue_time_s": finished.queue_time_s, "ttft_s": finished.ttft_s,
            "e2e_s": finished.e2e_s, "preemptions": finished.preemptions}


class Reply(ABC):
    """The response of one request in one dialect. Streaming: `opening()` goes out with
    the first token(s) (so the first bytes a client sees mark its time to first token),
    then `tokens(i, k)` per wake-up for k new tokens of sequence i (pre-encoded, so k
    tokens cost a `bytes * k` where the format allows), then `closing()`. Not streaming:
    `body()`. A failure after the headers went out: `error_frame()`."""

    id: str

    @abstractmethod
    def opening(self) -> bytes: ...

    @abstractmethod
    def tokens(self, index: int, k: int) -> bytes: ...

    @abstractmethod
    def closing(self, outcome: Outcome) -> bytes: ...

    @abstractmethod
    def body(self, outcome: Outcome) -> bytes: ...

    @abstractmethod
    def error_frame(self, err: GatewayError) -> bytes: ...

    def reasoned(self, tokens: int) -> None:
        """The engine's word on admission: each sequence's first `tokens` tokens are
        reasoning (gateway.protocols.reasoning). A reply that shows reasoning keeps it
        (before its opening); the others never get a reasoning share and ignore it."""


class _MadeOnFirstUse:
    """`reply`: made by `make_reply` on first use (a request refused with a 529 needs none:
    no response id, no pre-encoded templates)."""

    __slots__ = ()

    @property
    def reply(self):
        reply = self._reply
        if reply is None:
            reply = self._reply = self.make_reply()
        return reply


@dataclass(slots=True)
class Generation(_MadeOnFirstUse):
    """What the engine path needs from a parsed request."""

    model: str
    prompt: Sequence[int]  # the prompt's token IDs
    max_tokens: int | None  # the client's explicit cap, if it gave one
    stream: bool
    # Makes the request's Reply, on first use of `reply` (a request refused with a 529
    # needs none: no response id, no pre-encoded templates).
    make_reply: Callable[[], Reply]
    n: int = 1  # sequences to sample (parallel sampling)
    priority: int = 0  # vLLM extension: lower runs first under policy "priority"
    _reply: Reply | None = field(default=None, repr=False)
    # the share of the reply that is reasoning (SubmitRequest.reasoning_share): 0 none,
    # None the engine's default (a reasoning model's, with --reasoning)
    reasoning: float | None = 0.0
    # vLLM's kv_transfer_params as parsed (openai.schemas.KvTransferParams), or None
    kv_transfer: object = None

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt)


class BatchReply(ABC):
    """The response of one request of several prompts (completions), prompt-major: prompt
    p's n choices are indices p * n .. p * n + n - 1. Streaming: `parts[p]` renders prompt
    p's opening, tokens and, as its `closing`, only its own choices' final chunks; then
    `closing(outcomes)` ends the whole stream once every prompt finished. Not streaming:
    `body(outcomes)`, one outcome per prompt."""

    id: str
    parts: list[Reply]

    @abstractmethod
    def closing(self, outcomes: list[Outcome]) -> bytes: ...

    @abstractmethod
    def body(self, outcomes: list[Outcome]) -> bytes: ...

    @abstractmethod
    def error_frame(self, err: GatewayError) -> bytes: ...

    def chunks(self, outcomes: list[Outcome]) -> Iterator[bytes]:
        """`body(outcomes)` in the pieces it is written in (one, unless a reply makes a
        large body piece by piece)."""
        yield self.body(outcomes)


@dataclass(slots=True)
class Batch(_MadeOnFirstUse):
    """What the engine path needs from a request of several prompts: each prompt is an
    engine request of its own (its own arrival, prefill and place in the queue), with the
    same cap, `n` and priority; one response for all (`gateway.protocols.batch`)."""

    model: str
    prompts: list[Sequence[int]]  # each prompt's token IDs
    max_tokens: int | None
    stream: bool
    make_reply: Callable[[], BatchReply]
    n: int = 1
    priority: int = 0
    _reply: BatchReply | None = field(default=None, repr=False)
    # the field its prompts come from, for the engine's refusal of one of them (`{}`: the
    # prompt's index)
    where: str = "$.prompt[{}]"
    job: object = None  # the dialect's parsed request, for its `check` (pooling routes)


class Dialect(ABC):
    """One client-facing API: parses its request bodies, renders its error bodies, and
    checks a parsed request against the model it names (`check`, once the model is known:
    a generation route refuses a pooling model as vLLM does)."""

    name: str
    api = "Generation"  # as vLLM names the API in "The model does not support ... API"

    @abstractmethod
    def parse(self, body: bytes, tokenizer: Tokenizer) -> Generation | Batch: ...

    def check(self, gen: Generation | Batch, model) -> None:
        """Raise the 400 vLLM gives when `model` (the engine's ModelInfo) cannot serve
        `gen`: here, a pooling model on a generation route."""
        if model.HasField("pooling"):
            raise invalid(f"The model does not support {self.api} API")

    def error_body(self, err: GatewayError) -> bytes:
        return envelope(err)


# ---- SSE framing ----------------------------------------------------------------------

DONE_FRAME = b"data: [DONE]\n\n"


def data_frame(obj: object) -> bytes:
    """An unnamed SSE event (OpenAI chat and completions)."""
    return b"data: " + json_encode(obj) + b"\n\n"


def event_frame(name: str, obj: object) -> bytes:
    """A named SSE event (Anthropic Messages, OpenAI Responses)."""
    return b"event: " + name.encode() + b"\ndata: " + json_encode(obj) + b"\n\n"
