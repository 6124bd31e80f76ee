"""The gateway's errors and the translations at its edges, over the one error table
(common.error_table: each kind of failure mapped once to HTTP status, OpenAI error
`type` and `code`, Anthropic error `type`, gRPC status code).

Knows: how an engine refusal (a Session `Rejected`, or a unary call's gRPC status)
becomes one of them; the OpenAI error envelope `{"error": {"message", "type", "code"}}` and
the Anthropic one `{"type": "error", "error": {"type", "message"}}` as HTTP responses (the API dialect of the
route picks which: `gateway.protocols`); the OpenAI envelope as an SSE frame; and that
every error is logged as one line.

Does not know: routes, request schemas, or how the engine is reached.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Mapping

import grpc
from aiohttp import web
from google.rpc import error_details_pb2, status_pb2

from inference_lab.common.error_table import ERRORS, SATURATED_SPECS, ErrorKind, ErrorSpec
from inference_lab.common.error_table import anthropic_envelope as anthropic_body
from inference_lab.common.error_table import openai_envelope

__all__ = ["ERRORS", "SATURATED_SPECS", "ErrorKind", "ErrorSpec", "GatewayError", "Saturation",
           "SATURATED_529", "engine_unavailable", "from_rejected", "from_grpc_error",
           "envelope", "anthropic_envelope", "log_error", "error_response", "saturated_body",
           "saturated_response", "sse_error_frame", "from_http_exception", "from_parser_refusal"]

log = logging.getLogger("inference_lab.gateway.errors")


_KIND_BY_GRPC: dict[grpc.StatusCode, ErrorKind] = {
    grpc.StatusCode[spec.grpc_code]: kind for kind, spec in ERRORS.items()
    if spec.grpc_code is not None
}
# Statuses a call gets when the engine cannot be reached or the call was cut.
for _code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
    _KIND_BY_GRPC[_code] = ErrorKind.ENGINE_UNAVAILABLE
_KIND_BY_GRPC_INT: dict[int, ErrorKind] = {
    code.value[0]: kind for code, kind in _KIND_BY_GRPC.items()
}


class GatewayError(Exception):
    """A failure with a kind from the table and a human-readable message (`spec`: the
    table's row unless one is given, as a saturation setting gives its own)."""

    def __init__(self, kind: ErrorKind, message: str,
                 headers: Mapping[str, str] | None = None,
                 details: Mapping[str, object] | None = None,
                 spec: ErrorSpec | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.headers = dict(headers) if headers else None  # extra response headers
        self.details = dict(details) if details else None  # Anthropic's `error.details`
        self._spec = spec

    @property
    def spec(self) -> ErrorSpec:
        return self._spec or ERRORS[self.kind]


@dataclass(frozen=True, slots=True)
class Saturation:
    """How a saturated model's refusal is answered: its status (529, the default; 503 or
    429) and, when set, a `Retry-After` of that many whole seconds."""

    status: int = 529
    retry_after: int | None = None

    def __post_init__(self) -> None:
        if self.status not in SATURATED_SPECS:
            raise ValueError(f"the saturated status must be one of "
                             f"{', '.join(map(str, SATURATED_SPECS))}, got {self.status}")
        if self.retry_after is not None and not 0 <= self.retry_after <= 86_400:
            raise ValueError(f"retry-after must be 0..86400 seconds, got {self.retry_after}")

    @property
    def spec(self) -> ErrorSpec:
        return SATURATED_SPECS[self.status]

    def headers(self) -> dict[str, str] | None:
        return None if self.retry_after is None else {"Retry-After": str(self.retry_after)}

    def apply(self, err: GatewayError) -> GatewayError:
        """A QUEUE_SATURATED error as this setting answers it (headers already on it, a
        fault's retry hints, win); any other error unchanged."""
        if err.kind is not ErrorKind.QUEUE_SATURATED or err._spec is not None or (
                self.status == 529 and self.retry_after is None):
            return err
        headers = {**(self.headers() or {}), **(err.headers or {})}
        return GatewayError(err.kind, err.message, headers, err.details, self.spec)


SATURATED_529 = Saturation()


def engine_unavailable(detail: str = "") -> GatewayError:
    message = "The inference engine is unavailable"
    return GatewayError(ErrorKind.ENGINE_UNAVAILABLE, f"{message}: {detail}" if detail else message)


def from_rejected(
    code: int, reason: str, message: str, metadata: Mapping[str, str]
) -> GatewayError:
    """A Session `Rejected` (its fields) as a GatewayError, with the engine's message
    (the refusal text has one home: the engine)."""
    kind = _KIND_BY_GRPC_INT.get(code, ErrorKind.INTERNAL)
    if kind is ErrorKind.QUEUE_SATURATED or reason == "QUEUE_SATURATED":
        return GatewayError(ErrorKind.QUEUE_SATURATED, message or reason)
    replica_kind = _REPLICA_REASONS.get(reason)
    if replica_kind is not None:
        return GatewayError(replica_kind, message or reason)
    if kind is ErrorKind.ENGINE_UNAVAILABLE:
        return engine_unavailable(message or reason)
    return GatewayError(kind, message or reason or f"engine refused the request (code {code})")


# Session refusal reasons with a kind of their own: about replicas (engine.fleet), and
# the P/D handoffs' cap (engine.sim.kv_transfer).
_REPLICA_REASONS = {
    "KV_TRANSFER_FULL": ErrorKind.KV_TRANSFER_FULL,
    "REPLICA_NOT_FOUND": ErrorKind.REPLICA_NOT_FOUND,
    "REPLICA_NOT_READY": ErrorKind.REPLICA_UNAVAILABLE,
    "REPLICA_DRAINING": ErrorKind.REPLICA_UNAVAILABLE,
    "REPLICA_SLEEPING": ErrorKind.ENGINE_SLEEPING,
    "NO_REPLICA": ErrorKind.REPLICA_UNAVAILABLE,
}


def _error_info_reason(exc: grpc.aio.AioRpcError) -> str:
    """google.rpc.ErrorInfo.reason of a failed call's rich status, if it has one."""
    for key, value in exc.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for detail in status_pb2.Status.FromString(value).details:
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info):
                    return info.reason
    return ""


def from_grpc_error(exc: grpc.aio.AioRpcError) -> GatewayError:
    """A unary call's failure status as a GatewayError (a replica refusal by its reason).
    A failure the table does not know (an engine bug: UNKNOWN, INTERNAL) is logged here
    and answered without its text, which may be an exception's."""
    kind = _KIND_BY_GRPC.get(exc.code(), ErrorKind.INTERNAL)
    if kind is ErrorKind.INTERNAL:
        log.error("the engine failed a call: %s: %s", exc.code().name, exc.details())
        return GatewayError(kind, "Internal server error (the engine failed the call; its "
                                  "log and the gateway's have the details).")
    details = exc.details() or exc.code().name
    if kind in (ErrorKind.MODEL_NOT_FOUND, ErrorKind.ENGINE_UNAVAILABLE):
        replica_kind = _REPLICA_REASONS.get(_error_info_reason(exc))
        if replica_kind is not None:
            return GatewayError(replica_kind, details)
    if kind is ErrorKind.ENGINE_UNAVAILABLE:
        return engine_unavailable(details)
    return GatewayError(kind, details)


def envelope(err: GatewayError) -> bytes:
    """OpenAI's error body of `err` (common.error_table)."""
    return openai_envelope(err.spec, err.message)


def anthropic_envelope(err: GatewayError) -> bytes:
    """Anthropic's error body of `err` (common.error_table), with its `details`."""
    return anthropic_body(err.spec, err.message, err.details)


def _log_level(status: int) -> int:
    # A 529 is the product working as intended, possibly thousands of times a second:
    # counted in /metrics, logged at DEBUG only.
    if status == 529:
        return logging.DEBUG
    return logging.WARNING if status >= 500 else logging.INFO


def log_error(err: GatewayError, where: str) -> None:
    spec = err.spec
    log.log(_log_level(spec.status), "%s -> %d %s: %s", where, spec.status, spec.code,
            err.message)


def error_response(err: GatewayError, request: web.BaseRequest | None = None,
                   render: Callable[[GatewayError], bytes] = envelope) -> web.Response:
    """The bare JSON error response (never an event stream), logged as one line; `render`
    is the route's envelope (OpenAI's unless the route's API dialect says otherwise)."""
    status = err.spec.status
    if log.isEnabledFor(_log_level(status)):  # (a 529 usually is not: no line to format)
        log_error(err, f"{request.method} {request.path}" if request is not None else "-")
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
    if err.headers:
        headers.update(err.headers)
    return web.Response(status=status, body=render(err), content_type="application/json",
                        headers=headers or None)


_SATURATED_BODIES: dict[tuple[Callable[[GatewayError], bytes], str, int], bytes] = {}
_SATURATED_CACHE_MAX = 64  # envelopes x the engine's messages (one per capacity setting)


def saturated_body(message: str, render: Callable[[GatewayError], bytes],
                   where: Callable[[], str], saturation: Saturation = SATURATED_529) -> bytes:
    """The body `error_response` renders for GatewayError(QUEUE_SATURATED, message) with
    `render` under `saturation`, logged as its one line when DEBUG is enabled (`where()`:
    "METHOD /path"): the hot path of a saturated model (up to thousands a second),
    rendered once per envelope, message and status (the engine's message changes only
    with the capacity)."""
    key = (render, message, saturation.status)
    body = _SATURATED_BODIES.get(key)
    if body is None or log.isEnabledFor(logging.DEBUG):
        err = GatewayError(ErrorKind.QUEUE_SATURATED, message, spec=saturation.spec)
        if log.isEnabledFor(logging.DEBUG):
            log_error(err, where())
        if body is None:
            if len(_SATURATED_BODIES) >= _SATURATED_CACHE_MAX:
                _SATURATED_BODIES.clear()
            body = _SATURATED_BODIES[key] = render(err)
    return body


def saturated_response(message: str, request: web.BaseRequest | None = None,
                       render: Callable[[GatewayError], bytes] = envelope,
                       saturation: Saturation = SATURATED_529) -> web.Response:
    """The refusal (529 unless `saturation` says otherwise) that `error_response` makes of
    GatewayError(QUEUE_SATURATED, message) under `saturation`, byte for byte, built
    without the exception (`saturated_body`)."""
    body = saturated_body(message, render, lambda: f"{request.method} {request.path}"
                          if request is not None else "-", saturation)
    return web.Response(status=saturation.status, body=body, content_type="application/json",
                        headers=saturation.headers())


def sse_error_frame(err: GatewayError) -> bytes:
    """An in-stream failure (after headers went out) in OpenAI's streams: an error frame,
    then [DONE]. (The engine path logs it.)"""
    return b"data: " + envelope(err) + b"\n\ndata: [DONE]\n\n"


# aiohttp's parser refusals (gateway.edge), by the status aiohttp gives them.
_PARSER_KINDS = {400: ErrorKind.BAD_HTTP_REQUEST, 408: ErrorKind.REQUEST_TIMEOUT,
                 413: ErrorKind.BODY_TOO_LARGE, 431: ErrorKind.HEADERS_TOO_LARGE,
                 500: ErrorKind.INTERNAL, 501: ErrorKind.NOT_IMPLEMENTED,
                 505: ErrorKind.HTTP_VERSION_NOT_SUPPORTED}


def from_parser_refusal(status: int, message: str) -> GatewayError:
    """A refusal of malformed HTTP with aiohttp's `status` (or the edge's 408) in the
    table; a status without a row keeps its status, typed by its class, coded as a bad
    HTTP request."""
    kind = _PARSER_KINDS.get(status)
    if kind is not None:
        return GatewayError(kind, message)
    spec = ErrorSpec(status, "server_error" if status >= 500 else "invalid_request_error",
                     "bad_http_request", None)
    return GatewayError(ErrorKind.BAD_HTTP_REQUEST, message, spec=spec)


def from_http_exception(exc: web.HTTPException) -> GatewayError:
    """aiohttp's own refusals (unknown route, wrong method, body too large) in our table."""
    by_status = {
        404: ErrorKind.ROUTE_NOT_FOUND,
        405: ErrorKind.METHOD_NOT_ALLOWED,
        413: ErrorKind.BODY_TOO_LARGE,
        415: ErrorKind.UNSUPPORTED_MEDIA_TYPE,
        401: ErrorKind.UNAUTHORIZED,
        400: ErrorKind.INVALID_REQUEST,
    }
    default = ErrorKind.INTERNAL if exc.status >= 500 else ErrorKind.INVALID_REQUEST
    return GatewayError(by_status.get(exc.status, default), exc.text or exc.reason)
