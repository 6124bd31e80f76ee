"""vLLM's derender API: an engine's token-out answer back into the OpenAI response.

Knows: `POST /v1/chat/completions/derender` (vLLM's DerenderChatRequest: `model`, one
`generate_response` in the shape `/inference/v1/generate` answers, `prompt_tokens` for the
usage, the original `chat_request` accepted and unused) answering a ChatCompletionResponse,
and `POST /v1/completions/derender` (DerenderCompletionRequest: `generate_responses`, one
per prompt as `/v1/completions/render` gave them, `prompt_tokens` one count per prompt)
answering a CompletionResponse; each choice's text is its token IDs decoded by the
server's tokenizer, its finish reason the response's (`length` when none is given).
Streaming derender is not served (vLLM serves none either: `stream` must be false).
The checks are vLLM's shapes, with the lab's 400 envelope naming the field.

Does not know: the engine (nothing here is generated: the caller brings the tokens),
aiohttp (gateway.routing serves it).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import msgspec

from inference_lab.common.tokenizer import Tokenizer
from inference_lab.gateway.protocols.base import decode, invalid, random_id

_ID = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]
_COUNT = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]


class Choice(msgspec.Struct, kw_only=True):
    index: _COUNT = 0
    token_ids: list[_ID]
    finish_reason: str | None = None
    logprobs: Any = None


class GenerateResponse(msgspec.Struct, kw_only=True):
    request_id: str = ""
    choices: list[Choice]
    prompt_logprobs: Any = None
    kv_transfer_params: dict | None = None
    model: str | None = None
    created: int | None = None
    usage: Any = None


class ChatDerender(msgspec.Struct, kw_only=True):
    model: str
    generate_response: GenerateResponse
    prompt_tokens: _COUNT | None = None
    chat_request: dict | None = None
    stream: bool = False  # (must be false: `_not_streamed`)


class CompletionDerender(msgspec.Struct, kw_only=True):
    model: str
    generate_responses: list[GenerateResponse]
    prompt_tokens: list[_COUNT] | None = None
    completion_request: dict | None = None
    stream: bool = False  # (must be false: `_not_streamed`)


_chat = msgspec.json.Decoder(ChatDerender)
_completion = msgspec.json.Decoder(CompletionDerender)


def _not_streamed(req):
    if req.stream:
        raise invalid("stream: derender is not streamed (vLLM serves no streaming derender): "
                      "expected false - at `$.stream`")
    return req


def parse_chat(body: bytes) -> ChatDerender:
    return _not_streamed(decode(
        _chat, body, "chat derender request",
        'expected {"model": string, "generate_response": {"choices": '
        '[{"index", "token_ids", "finish_reason"}]}, "prompt_tokens"?: integer}'))


def parse_completion(body: bytes) -> CompletionDerender:
    req = decode(_completion, body, "completion derender request",
                 'expected {"model": string, "generate_responses": [{"choices": [...]}], '
                 '"prompt_tokens"?: [integer, ...]}')
    _not_streamed(req)
    if not req.generate_responses:
        raise invalid("generate_responses must hold one response per prompt - at "
                      "`$.generate_responses`")
    if req.prompt_tokens is not None and len(req.prompt_tokens) != len(req.generate_responses):
        raise invalid(f"prompt_tokens must give one count per response "
                      f"({len(req.generate_responses)}), got {len(req.prompt_tokens)} - at "
                      "`$.prompt_tokens`")
    return req


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def chat_response(req: ChatDerender, tok: Tokenizer) -> dict:
    """The ChatCompletionResponse of one engine response."""
    gen = req.generate_response
    choices = [{"index": c.index,
                "message": {"role": "assistant", "content": tok.decode(c.token_ids)},
                "logprobs": None, "finish_reason": c.finish_reason or "length"}
               for c in gen.choices]
    completion = sum(len(c.token_ids) for c in gen.choices)
    return {"id": f"chatcmpl-{gen.request_id or random_id()}", "object": "chat.completion",
            "created": int(time.time()), "model": req.model, "choices": choices,
            "usage": _usage(req.prompt_tokens or 0, completion)}


def completion_response(req: CompletionDerender, tok: Tokenizer) -> dict:
    """The CompletionResponse of one engine response per prompt: prompt p's choices
    numbered after the choices of the prompts before it."""
    choices, completion = [], 0
    for gen in req.generate_responses:
        for c in gen.choices:
            choices.append({"index": len(choices), "text": tok.decode(c.token_ids),
                            "logprobs": None, "finish_reason": c.finish_reason or "length"})
            completion += len(c.token_ids)
    first = req.generate_responses[0].request_id
    return {"id": f"cmpl-{first or random_id()}", "object": "text_completion",
            "created": int(time.time()), "model": req.model, "choices": choices,
            "usage": _usage(sum(req.prompt_tokens or ()), completion)}
