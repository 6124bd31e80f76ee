"""Anthropic's token counting route, `POST /v1/messages/count_tokens`: the prompt a
`/v1/messages` request with the same `model`, `system`, `messages` and `tools` would send,
counted with the lab's tokenizer (the `input_tokens` its usage reports), as
`{"input_tokens": N}`. Errors use Anthropic's envelope (the route is under /v1/messages).

Does not know: the engine protocol (the caller hands in the gateway's EngineClient, to
check the model, and its tokenizer), metrics or errors beyond raising GatewayError.
"""

from __future__ import annotations

from typing import Annotated, Any, Callable

import msgspec
from aiohttp import web

from inference_lab.common.tokenizer import Tokenizer
from inference_lab.gateway.protocols.anthropic import ContentBlock, Message, messages_prompt
from inference_lab.gateway.protocols.base import decode, json_encode

PATH = "/v1/messages/count_tokens"


class CountTokensRequest(msgspec.Struct, kw_only=True):
    model: str
    messages: Annotated[list[Message], msgspec.Meta(min_length=1)]
    system: str | list[ContentBlock] | None = None
    tools: Any = None


_decoder = msgspec.json.Decoder(CountTokensRequest)


def add_routes(app: web.Application, client: Callable[[], object],
               tokenizer: Callable[[], Tokenizer], read_body) -> None:
    """`client()` is the gateway's EngineClient, `tokenizer()` its tokenizer and
    `read_body(request)` its size- and type-checked body reader."""

    async def count_tokens(request: web.Request) -> web.Response:
        req = decode(_decoder, await read_body(request))
        await client().resolve_model(req.model)  # 404 not_found_error for an unknown one
        count = len(messages_prompt(tokenizer(), req))
        return web.Response(body=json_encode({"input_tokens": count}),
                            content_type="application/json")

    app.router.add_post(PATH, count_tokens)
