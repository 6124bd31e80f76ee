"""Injected errors and retry hints at the HTTP edge: the generation handlers' wrapper and
/control/faults.

Knows: which routes are generation requests (the ones errors are injected into), how to
learn a request's model from its body without disturbing the handler (aiohttp keeps the
body it read), the injected error as a response (OpenAI's envelope; Anthropic's on
/v1/messages), the retry hints added to every 429, 503 and 529 of a generation route
(injected or real), and `GET/POST /control/faults` with its schema (precise 400s naming
the field and listing what is valid, a script of at most MAX_SCRIPT_STEPS steps). After
every change the state is handed to `save` (the state file, when the server has a
--state-dir: gateway.faults.saving, off the event loop).

Does not know: how decisions are made (gateway.faults.injection) or the engine.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Annotated, Awaitable, Callable, Literal

import msgspec
from aiohttp import web

from inference_lab.gateway.edge import read_body
from inference_lab.gateway.errors import ErrorKind, GatewayError
from inference_lab.gateway.faults.injection import INJECTED, OK, TYPES, ErrorType, FaultState
from inference_lab.gateway.faults.saving import FaultSaver
from inference_lab.gateway.protocols.base import decode, invalid, json_encode

log = logging.getLogger("inference_lab.gateway.faults")

GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/messages",
                              "/v1/responses"})
_ANTHROPIC_PATHS = frozenset({"/v1/messages"})
_ANTHROPIC_TYPE = {429: "rate_limit_error", 401: "authentication_error",
                   400: "invalid_request_error", 404: "not_found_error", 500: "api_error",
                   503: "api_error", 529: "overloaded_error"}
_MAX_SCRIPT = 1_000_000  # requests in one step
MAX_SCRIPT_STEPS = 1_000  # steps in one script


@dataclass(slots=True)
class FaultControl:
    state: FaultState
    max_body_bytes: int
    models: Callable[[], Awaitable[list[str]]]  # the served model names
    save: FaultSaver | None = None


FAULTS: web.AppKey[FaultControl] = web.AppKey("faults", FaultControl)


class _ModelOnly(msgspec.Struct):
    model: str = ""


_model_decoder = msgspec.json.Decoder(_ModelOnly)


async def _model_of(request: web.Request, limit: int) -> str:
    """The body's `model`, or "" when it has none (the handler reports bad bodies)."""
    if request.content_length is not None and request.content_length > limit:
        return ""
    try:
        body = await read_body(request)  # kept by aiohttp: the handler reads the same bytes
    except web.HTTPException:
        return ""  # too large: the handler says so
    try:
        return _model_decoder.decode(body).model
    except (msgspec.DecodeError, ValueError, RecursionError):
        return ""


def injected_response(request: web.BaseRequest, error: ErrorType, model: str,
                      headers: dict[str, str]) -> web.Response:
    spec = INJECTED[error]
    if request.path in _ANTHROPIC_PATHS:
        body = {"type": "error", "error": {"type": _ANTHROPIC_TYPE[spec.status],
                                           "message": spec.message}}
    else:
        body = {"error": {"message": spec.message, "type": spec.type, "param": spec.param,
                          "code": spec.code}}
    log.info("%s %s (model %r): injected %s -> %d", request.method, request.path, model,
             error.value, spec.status)
    return web.Response(status=spec.status, body=json_encode(body),
                        content_type="application/json", headers=headers or None)


async def with_faults(request: web.Request, handler, control: FaultControl) -> web.StreamResponse:
    """A generation request (a POST to one of GENERATION_PATHS) while injected errors or
    retry hints are set (`control.state.active`; the generation handlers call `handler`
    directly otherwise): the injected error, or `handler`'s response with the hints."""
    state = control.state
    model = await _model_of(request, control.max_body_bytes)
    scripted = bool(state.scripts)
    error = state.decide(model)
    if scripted and control.save is not None:
        control.save.changed(state)  # a script step was used up: a restart must not replay it
    if error is not None:
        return injected_response(request, error, model,
                                 state.hints(model, INJECTED[error].status))
    try:
        resp = await handler(request)
    except GatewayError as err:
        hints = state.hints(model, err.spec.status)
        if hints:
            err.headers = {**(err.headers or {}), **hints}
        raise
    if not resp.prepared:
        resp.headers.update(state.hints(model, resp.status))
    return resp


# ---- /control/faults ------------------------------------------------------------------------

_Type = Literal[TYPES]  # type: ignore[valid-type]
_StepError = Literal[TYPES + (OK,)]  # type: ignore[valid-type]


class ScriptStepIn(msgspec.Struct, forbid_unknown_fields=True):
    error: _StepError
    count: Annotated[int, msgspec.Meta(ge=1, le=_MAX_SCRIPT)] = 1


class FaultsUpdate(msgspec.Struct, forbid_unknown_fields=True):
    model: str | None = None
    rate: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | msgspec.UnsetType = msgspec.UNSET
    types: Annotated[list[_Type], msgspec.Meta(min_length=1)] | msgspec.UnsetType = msgspec.UNSET
    retry_after: Annotated[float, msgspec.Meta(ge=0.0, le=86_400.0)] | None | \
        msgspec.UnsetType = msgspec.UNSET
    retry_after_ms: Annotated[int, msgspec.Meta(ge=0, le=86_400_000)] | None | \
        msgspec.UnsetType = msgspec.UNSET
    should_retry: bool | None | msgspec.UnsetType = msgspec.UNSET
    script: Annotated[list[ScriptStepIn], msgspec.Meta(max_length=MAX_SCRIPT_STEPS)] | \
        msgspec.UnsetType = msgspec.UNSET
    seed: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] | msgspec.UnsetType = msgspec.UNSET
    reset: bool = False


_update_decoder = msgspec.json.Decoder(FaultsUpdate)
_SETTINGS = ("rate", "types", "retry_after", "retry_after_ms", "should_retry")


def decode_update(body: bytes) -> FaultsUpdate:
    update = decode(_update_decoder, body, "fault settings",
                         f"Error types: {', '.join(TYPES)}; a script step is "
                         f'{{"error": <type or "{OK}">, "count": N}}')
    given = [f for f in (*_SETTINGS, "script", "seed") if getattr(update, f) is not msgspec.UNSET]
    if not given and not update.reset:
        raise invalid("Nothing to change: give one or more of rate, types, retry_after, "
                       "retry_after_ms, should_retry, script, seed, reset.")
    return update


def apply_update(state: FaultState, update: FaultsUpdate) -> None:
    if update.reset:  # everything back to the defaults (seed kept unless given)
        state.clear()
    changes = {f: getattr(update, f) for f in _SETTINGS if getattr(update, f) is not msgspec.UNSET}
    if "types" in changes:
        changes["types"] = tuple(ErrorType(t) for t in changes["types"])
    if changes:
        state.update(update.model, **changes)
    if update.script is not msgspec.UNSET:
        state.set_script(update.model, [(s.error, s.count) for s in update.script])
    if update.seed is not msgspec.UNSET:
        state.reseed(update.seed)


async def get_faults(request: web.Request) -> web.Response:
    return web.Response(body=json_encode(request.app[FAULTS].state.view()),
                        content_type="application/json")


async def post_faults(request: web.Request) -> web.Response:
    control = request.app[FAULTS]
    if request.content_length is not None and request.content_length > control.max_body_bytes:
        raise GatewayError(ErrorKind.BODY_TOO_LARGE,
                           f"Request body too large: the limit is {control.max_body_bytes} bytes.")
    update = decode_update(await read_body(request))
    if update.model is not None:
        served = await control.models()
        if update.model not in served:
            raise GatewayError(ErrorKind.MODEL_NOT_FOUND,
                               f"The model `{update.model}` does not exist "
                               f"(served: {', '.join(served)}).")
    apply_update(control.state, update)
    log.info("faults now: %s", control.state.snapshot())
    if control.save is not None:
        await control.save.save(control.state)  # saved before the answer
    return await get_faults(request)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/control/faults", get_faults)
    app.router.add_post("/control/faults", post_faults)
