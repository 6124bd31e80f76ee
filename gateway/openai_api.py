"""The OpenAI-compatible request and response shapes, with nothing about transport.

Knows: the request bodies of /v1/chat/completions and /v1/completions as msgspec schemas
(precise 400 messages naming the field; unknown OpenAI fields are ignored), the
deterministic prompt-length estimate the engine needs (it simulates lengths, not text),
how many tokens to ask for, and the response bytes: per-request pre-encoded SSE chunk
templates so that k coalesced tokens cost one `bytes * k`, the final chunk, the usage
frame (`choices: []`), `[DONE]`, and the non-streaming JSON body.

Does not know: aiohttp, gRPC, or the engine's events; the handler in `gateway.app` turns
events into calls of `Completion`'s methods.
"""

from __future__ import annotations

import random
import time
import uuid
from typing import Annotated, Callable

import msgspec

from inference_lab.gateway.errors import ErrorKind, GatewayError

# One JSON library for the whole gateway.
json_encode = msgspec.json.Encoder().encode

PLACEHOLDER_TOKEN = " token"  # the text of every simulated token
DONE_FRAME = b"data: [DONE]\n\n"

_U31 = 2**31 - 1
PositiveInt = Annotated[int, msgspec.Meta(ge=1, le=_U31)]
Priority = Annotated[int, msgspec.Meta(ge=-(2**31), le=_U31)]


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct):
    role: str
    content: str | list[ContentPart] | None = None


class _GenerationRequest(msgspec.Struct, kw_only=True):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: PositiveInt | None = None
    n: int = 1
    priority: Priority = 0  # vLLM extension: lower runs first under policy "priority"

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(_GenerationRequest, kw_only=True):
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)]
    max_completion_tokens: PositiveInt | None = None


class CompletionRequest(_GenerationRequest, kw_only=True):
    prompt: str | list[str | int | list[int]]
    max_completion_tokens: PositiveInt | None = None  # accepted for symmetry


_chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)


def invalid(message: str) -> GatewayError:
    return GatewayError(ErrorKind.INVALID_REQUEST, message)


def decode_request(body: bytes, chat: bool) -> ChatCompletionRequest | CompletionRequest:
    """Parse and validate a generation body; GatewayError(invalid_request) names the field."""
    if not body:
        raise invalid("Invalid request body: expected a JSON object, got an empty body")
    try:
        req = (_chat_decoder if chat else _completion_decoder).decode(body)
    except msgspec.ValidationError as exc:
        raise invalid(f"Invalid request body: {exc}") from None
    except msgspec.DecodeError as exc:
        raise invalid(f"Invalid JSON body: {exc}") from None
    if req.n != 1:
        raise invalid(f"Only n = 1 is supported, got n = {req.n} - at `$.n`")
    return req


# ---- prompt length (deterministic: the engine needs lengths only) ------------------------


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def _ceil4(n: int) -> int:
    return (n + 3) // 4


def text_tokens(text: str) -> int:
    """max(1, ceil(utf-8 bytes / 4))."""
    return max(1, _ceil4(_utf8_len(text)))


def chat_tokens(messages: list[ChatMessage]) -> int:
    """Sum over messages of (3 + ceil(content bytes / 4)), plus 3 for the reply's priming."""
    total = 3
    for message in messages:
        content = message.content
        if content is None:
            n = 0
        elif isinstance(content, str):
            n = _utf8_len(content)
        else:
            n = sum(_utf8_len(part.text) for part in content if part.text)
        total += 3 + _ceil4(n)
    return total


def prompt_tokens(prompt: str | list[str | int | list[int]]) -> int:
    """A completions prompt: a string, a list of one string, or token ids (flat or [[...]])."""
    if isinstance(prompt, str):
        return text_tokens(prompt)
    if not prompt:
        raise invalid("`prompt` must not be empty - at `$.prompt`")
    if all(type(item) is int for item in prompt):
        return len(prompt)
    if len(prompt) == 1:
        (only,) = prompt
        if isinstance(only, str):
            return text_tokens(only)
        if isinstance(only, list) and only:
            return len(only)
    raise invalid(
        "Batched or mixed prompts are not supported: send a string, a list of one string, "
        "or a list of token ids - at `$.prompt`"
    )


# ---- output length --------------------------------------------------------------------


class OutputLength:
    """How many tokens a request generates (the simulation has no EOS: exactly this many).

    Explicit max_completion_tokens / max_tokens wins; with a workload the length is a
    seeded draw from its output distribution, capped by an explicit max when both; else
    the default. Draws and the default are also capped to fit max_model_len (an explicit
    value is not: the engine refuses it with 400, like vLLM).
    """

    def __init__(self, default_max_tokens: int, sampler: Callable[[], int] | None = None):
        if default_max_tokens < 1:
            raise ValueError("default_max_tokens must be at least 1")
        self.default = default_max_tokens
        self._sampler = sampler

    @classmethod
    def from_workload(cls, default_max_tokens: int, workload_path: str | None,
                      seed: int = 0) -> "OutputLength":
        if workload_path is None:
            return cls(default_max_tokens)
        from inference_lab.common.workload import load_workload  # lazily: only when a workload is given

        spec = load_workload(workload_path)
        rng = random.Random(seed)
        dist = spec.output_len_dist
        return cls(default_max_tokens, lambda: int(dist.sample(rng)))

    def choose(self, requested: int | None, prompt_len: int, max_model_len: int) -> int:
        if self._sampler is None and requested is not None:
            return requested
        n = self._sampler() if self._sampler is not None else self.default
        if requested is not None:
            return max(1, min(n, requested))
        room = max_model_len - prompt_len
        if max_model_len > 0 and room >= 1:
            n = min(n, room)
        return max(1, n)


# ---- responses ------------------------------------------------------------------------


def _frame(obj: object) -> bytes:
    return b"data: " + json_encode(obj) + b"\n\n"


def modelled_timings(finished) -> dict[str, float]:
    """The engine's modelled (simulated) times of a finished request, in seconds: what
    the modelled GPU would have shown, for clients to compare with what they measured."""
    return {"queue_time_s": finished.queue_time_s, "ttft_s": finished.ttft_s,
            "e2e_s": finished.e2e_s, "preemptions": finished.preemptions}


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


class Completion:
    """The response of one request, chat or text completion, in either mode.

    Streaming: `head` goes out with the first token(s) (chat: the role delta), `token` is
    one token's pre-encoded SSE chunk, `tail()` is the final chunk, usage frame and [DONE].
    """

    __slots__ = ("chat", "id", "created", "model", "include_usage", "head", "token")

    def __init__(self, chat: bool, model: str, include_usage: bool = False) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage
        self.head = b""
        self.token = b""

    def _chunk(self, choices: list[dict], **extra: object) -> dict:
        chunk: dict = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            chunk["usage"] = None  # as OpenAI does on every chunk but the usage frame
        chunk.update(extra)
        return chunk

    def _choice(self, text: str | None, finish_reason: str | None, role: bool = False) -> dict:
        if self.chat:
            delta: dict = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}

    def start_stream(self) -> None:
        """Pre-encode the per-token chunk (and the chat role chunk) for this request."""
        if self.chat:
            self.head = _frame(self._chunk([self._choice(None, None, role=True)]))
        self.token = _frame(self._chunk([self._choice(PLACEHOLDER_TOKEN, None)]))

    def tail(self, prompt: int, completion: int, finish_reason: str = "length",
             modelled: dict | None = None) -> bytes:
        """The final chunk (carrying the engine's modelled timings, when given, under
        "inference_lab"), the usage frame if asked for, and [DONE]."""
        extra = {"inference_lab": modelled} if modelled else {}
        out = _frame(self._chunk([self._choice(None if self.chat else "", finish_reason)], **extra))
        if self.include_usage:
            usage_chunk = self._chunk([])
            usage_chunk["usage"] = _usage(prompt, completion)
            out += _frame(usage_chunk)
        return out + DONE_FRAME

    def body(self, prompt: int, completion: int, finish_reason: str = "length",
             modelled: dict | None = None) -> bytes:
        """The non-streaming JSON response (modelled timings under "inference_lab")."""
        text = PLACEHOLDER_TOKEN * completion
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return json_encode({
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": _usage(prompt, completion),
            **({"inference_lab": modelled} if modelled else {}),
        })
