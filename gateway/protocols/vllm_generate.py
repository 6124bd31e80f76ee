"""vLLM's tokens-in, tokens-out route: POST /inference/v1/generate.

Knows: the request (vLLM's GenerateRequest: `token_ids`, at least one, each in [0, 2^32);
`sampling_params` with `n`, `max_tokens` and the sampling fields checked as vLLM checks
them; `model`, absent for the first served model; `stream`, `stream_options`,
`request_id`, `priority`, `cache_salt`, `features` accepted; `kv_transfer_params` as the
other routes take them, for P/D), and its replies in vLLM's shapes: GenerateResponse
{request_id, choices: [{index, logprobs, finish_reason, token_ids}], prompt_logprobs,
kv_transfer_params} and, streamed, GenerateStreamResponse chunks {request_id, choices:
[{index, logprobs, finish_reason, token_ids}], usage} then `data: [DONE]`. Every
generated token is one ID, the first of the placeholder text's under the server's
tokenizer (`generated_id`), as every other route's tokens are the placeholder text.
The finish reason goes in a chunk of its own, with no token IDs (the tokens of a wake-up
are written before the engine says the request finished).

Does not know: aiohttp, gRPC or the engine's events (`gateway.protocols.generate` runs
it, with the same admission, 529 and pacing as every route).
"""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

import msgspec

from inference_lab.common.tokenizer import Tokenizer
from inference_lab.gateway.errors import GatewayError, sse_error_frame
from inference_lab.gateway.protocols.base import (
    _U31, DONE_FRAME, PLACEHOLDER_TOKEN, Dialect, Generation, NonNegative, Outcome, Reply,
    checked_ids, data_frame, decode, json_encode, random_id,
)
from inference_lab.gateway.protocols.openai.schemas import (
    MAX_N, KvTransferParams, NonNegativeInt, Priority, StreamOptions, VllmSampling,
)


class SamplingParams(VllmSampling, kw_only=True):
    """vLLM's SamplingParams as a request carries them: checked, mostly unused (every
    generated token is the placeholder)."""

    n: Annotated[int, msgspec.Meta(ge=1, le=MAX_N)] = 1
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=_U31)] | None = None
    min_tokens: NonNegativeInt = 0
    temperature: NonNegative | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: Annotated[int, msgspec.Meta(ge=-1)] | None = None
    prompt_logprobs: Annotated[int, msgspec.Meta(ge=-1)] | None = None
    detokenize: bool = True


class GenerateRequest(msgspec.Struct, kw_only=True):
    request_id: str | None = None
    token_ids: Annotated[list[int], msgspec.Meta(min_length=1)]
    features: Any = None  # multimodal features: accepted, not modelled
    sampling_params: SamplingParams
    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    cache_salt: str | None = None
    priority: Priority = 0
    kv_transfer_params: KvTransferParams | None = None


_decoder = msgspec.json.Decoder(GenerateRequest)


def generated_id(tokenizer: Tokenizer) -> int:
    """The ID every generated token has: the placeholder text's first token ID."""
    return tokenizer.encode(PLACEHOLDER_TOKEN)[0]


class TokensReply(Reply):
    """The reply of one /inference/v1/generate request, `n` sequences of `token` IDs."""

    __slots__ = ("id", "token", "n", "cap", "include_usage", "continuous", "prompt_tokens",
                 "_chunks", "emitted")

    def __init__(self, request_id: str, token: int, n: int, cap: int | None,
                 include_usage: bool, continuous: bool, prompt_tokens: int) -> None:
        self.id = request_id
        self.token = token
        self.n = n
        self.cap = cap  # the client's explicit max_tokens: reaching it is "length"
        self.include_usage = include_usage
        self.continuous = continuous  # vLLM's continuous_usage_stats: usage on each chunk
        self.prompt_tokens = prompt_tokens
        self._chunks: dict[tuple[int, int], bytes] = {}  # (sequence, k) -> its chunk
        self.emitted = [0] * n  # each sequence's tokens streamed so far

    def _usage(self, completion: int) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion}

    def _chunk(self, index: int, ids: list[int], finish_reason: str | None) -> bytes:
        usage = self._usage(self.emitted[index]) if self.continuous else None
        return data_frame({"request_id": self.id,
                           "choices": [{"index": index, "logprobs": None,
                                        "finish_reason": finish_reason, "token_ids": ids}],
                           "usage": usage})

    def _finish_reason(self, count: int) -> str:
        return "length" if self.cap is not None and count >= self.cap else "stop"

    def opening(self) -> bytes:
        return b""

    def tokens(self, index: int, k: int) -> bytes:
        self.emitted[index] += k
        if self.continuous:
            return self._chunk(index, [self.token] * k, None)
        chunk = self._chunks.get((index, k))
        if chunk is None:
            chunk = self._chunks[(index, k)] = self._chunk(index, [self.token] * k, None)
        return chunk

    def closing(self, outcome: Outcome) -> bytes:
        out = b"".join(self._chunk(i, [], self._finish_reason(count))
                       for i, count in enumerate(outcome.counts))
        if self.include_usage:
            out += data_frame({"request_id": self.id, "choices": [],
                               "usage": self._usage(outcome.completion_tokens)})
        return out + DONE_FRAME

    def body(self, outcome: Outcome) -> bytes:
        choices = [{"index": i, "logprobs": None, "finish_reason": self._finish_reason(count),
                    "token_ids": [self.token] * count}
                   for i, count in enumerate(outcome.counts)]
        return json_encode({"request_id": self.id, "choices": choices, "prompt_logprobs": None,
                            "kv_transfer_params": outcome.kv_transfer_params,
                            "inference_lab": outcome.modelled})

    def error_frame(self, err: GatewayError) -> bytes:
        return sse_error_frame(err)


class TokensGenerate(Dialect):
    name = "vllm.generate"
    api = "generate tokens"

    def parse(self, body: bytes, tokenizer: Tokenizer) -> Generation:
        req = decode(_decoder, body)
        prompt = checked_ids(req.token_ids, "$.token_ids")
        params = req.sampling_params
        options = req.stream_options
        include_usage = options is not None and options.include_usage
        continuous = include_usage and options.continuous_usage_stats
        # vLLM's id: "generate-tokens-" and the client's request_id (or x-request-id)
        request_id = f"generate-tokens-{req.request_id or random_id()}"
        reply = partial(TokensReply, request_id, generated_id(tokenizer), params.n,
                        params.max_tokens, include_usage, continuous, len(prompt))
        # an absent model is the first one served: the handler names it (`default_model`)
        return Generation(req.model or "", prompt, params.max_tokens, bool(req.stream), reply,
                          n=params.n, priority=req.priority, kv_transfer=req.kv_transfer_params)


GENERATE = TokensGenerate()
