"""What vLLM's API server adds to the OpenAI API, in vLLM's shapes: `GET /version`,
`POST /tokenize`, `POST /detokenize`, and the model card (`GET /v1/models` entries and
`GET /v1/models/{id}`, OpenAI's retrieve-model route).

Knows: the request bodies (msgspec schemas, 400s that name the field), the response
shapes of vLLM's `TokenizeResponse` {count, max_model_len, tokens, token_strs} and
`DetokenizeResponse` {prompt}, and the card {id, object, created, owned_by, root, parent,
max_model_len, permission}. Tokenizes with the lab's tokenizer, the one the generation
routes count prompts with (`inference_lab.common.tokenizer`: built in, or --tokenizer).

Does not know: the engine protocol (the caller hands in the gateway's EngineClient and
tokenizer), metrics or errors beyond raising GatewayError.
"""

from __future__ import annotations

import importlib.metadata
from typing import Annotated, Callable

import msgspec
from aiohttp import web

from inference_lab.common.tokenizer import Tokenizer
from inference_lab.gateway.errors import ErrorKind, GatewayError
from inference_lab.gateway.protocols.base import decode, json_encode
from inference_lab.gateway.protocols.openai.schemas import ChatMessage, chat_prompt, completion_prompt

TokenId = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]


class TokenizeCompletion(msgspec.Struct, kw_only=True):
    model: str | None = None
    prompt: str | list[str | int | list[int]]
    add_special_tokens: bool = True  # accepted; the lab's tokenizers add none
    return_token_strs: bool = False


class TokenizeChat(msgspec.Struct, kw_only=True):
    model: str | None = None
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)]
    add_generation_prompt: bool = True  # accepted; the reply's priming is always added
    add_special_tokens: bool = False
    return_token_strs: bool = False


class Detokenize(msgspec.Struct, kw_only=True):
    model: str | None = None
    tokens: list[TokenId]


_completion_decoder = msgspec.json.Decoder(TokenizeCompletion)
_chat_decoder = msgspec.json.Decoder(TokenizeChat)
_detokenize_decoder = msgspec.json.Decoder(Detokenize)


def version() -> str:
    try:
        return importlib.metadata.version("inference-lab")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def model_card(info) -> dict:
    """One model as vLLM's /v1/models lists it (`info`: the engine's ModelInfo)."""
    return {"id": info.name, "object": "model", "created": 0, "owned_by": "inference-lab",
            "root": info.name, "parent": info.parent or None,
            "max_model_len": info.max_model_len,
            "permission": [{"id": f"modelperm-{info.name}", "object": "model_permission",
                            "created": 0, "allow_create_engine": False, "allow_sampling": True,
                            "allow_logprobs": True, "allow_search_indices": False,
                            "allow_view": True, "allow_fine_tuning": False,
                            "organization": "*", "group": None, "is_blocking": False}]}


def _json(obj: object) -> web.Response:
    return web.Response(body=json_encode(obj), content_type="application/json")


def add_routes(app: web.Application, client: Callable[[], object],
               tokenizer: Callable[[], Tokenizer], read_body) -> None:
    """`client()` is the gateway's EngineClient, `tokenizer()` its tokenizer and
    `read_body(request)` its size- and type-checked body reader."""

    async def model_info(name: str | None):
        """The named model (404 like a generation request), or the first one served."""
        if name:
            return await client().resolve_model(name)
        models = await client().list_models()
        if not models:
            raise GatewayError(ErrorKind.MODEL_NOT_FOUND, "No model is served.")
        return models[0]

    async def show_version(request: web.Request) -> web.Response:
        return _json({"version": version()})

    async def tokenize(request: web.Request) -> web.Response:
        body = await read_body(request)
        chat = b'"messages"' in body  # the chat form (an escaped quote cannot match)
        req = decode(_chat_decoder if chat else _completion_decoder, body)
        info = await model_info(req.model)
        tok = tokenizer()
        ids = list(chat_prompt(tok, req.messages) if chat else completion_prompt(tok, req.prompt))
        strs = [tok.token_str(i) for i in ids] if req.return_token_strs else None
        return _json({"count": len(ids), "max_model_len": info.max_model_len, "tokens": ids,
                      "token_strs": strs})

    async def detokenize(request: web.Request) -> web.Response:
        req = decode(_detokenize_decoder, await read_body(request))
        await model_info(req.model)
        return _json({"prompt": tokenizer().decode(req.tokens)})

    async def retrieve_model(request: web.Request) -> web.Response:
        return _json(model_card(await client().resolve_model(request.match_info["model"])))

    app.router.add_get("/version", show_version)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/v1/models/{model:.+}", retrieve_model)
