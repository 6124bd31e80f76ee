"""The gateway's one error table and the translations at its edges.

Knows: every kind of failure the gateway reports, each mapped ONCE to (HTTP status,
OpenAI error `type`, `code`, Anthropic error `type`, gRPC status code); how an engine
refusal (a Session `Rejected`, or a unary call's gRPC status) becomes one of them; the
OpenAI error envelope `{"error": {"message", "type", "code"}}` and the Anthropic one
`{"type": "error", "error": {"type", "message"}}` as HTTP responses (the API dialect of the
route picks which: `gateway.protocols`); the OpenAI envelope as an SSE frame; and that
every error is logged as one line.

Does not know: routes, request schemas, or how the engine is reached.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Callable, Mapping

import grpc
import msgspec
from aiohttp import web
from google.rpc import error_details_pb2, status_pb2

log = logging.getLogger("inference_lab.gateway.errors")

_json_encode = msgspec.json.Encoder().encode


class ErrorKind(enum.StrEnum):
    QUEUE_SATURATED = "queue_saturated"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    MODEL_NOT_FOUND = "model_not_found"
    REPLICA_NOT_FOUND = "replica_not_found"
    REPLICA_UNAVAILABLE = "replica_unavailable"
    ENGINE_SLEEPING = "engine_sleeping"
    KV_TRANSFER_FULL = "kv_transfer_full"
    INVALID_REQUEST = "invalid_request"
    INVALID_FAULT_DIRECTIVE = "invalid_fault_directive"
    REQUEST_TIMEOUT = "request_timeout"
    BODY_TOO_LARGE = "body_too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    UNAUTHORIZED = "unauthorized"
    CONTROL_UNAUTHORIZED = "control_unauthorized"
    CROSS_ORIGIN_FORBIDDEN = "cross_origin_forbidden"
    ROUTE_NOT_FOUND = "route_not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    INTERNAL = "internal"
    PREVIOUS_RESPONSE_NOT_FOUND = "previous_response_not_found"
    RESPONSE_NOT_FOUND = "response_not_found"


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    status: int  # HTTP status
    type: str  # OpenAI error type
    code: str  # OpenAI error code
    grpc_code: grpc.StatusCode | None  # the engine status that means this kind, if any
    anthropic_type: str = "invalid_request_error"  # the Anthropic Messages API's error type


# The one table. 529 vs 503: 529 is "no room in the queue" (clients shed load on it),
# 503 is a liveness failure (engine unreachable, channel closed, shutting down). The
# Anthropic column follows Anthropic's documented error types; the `anthropic` SDK picks
# its exception class by status (anthropic/_error_classes.py; the lab sends no
# `error.details.error_code`, its other key): 529 OverloadedError,
# 503 ServiceUnavailableError, 500 InternalServerError (both are InternalServerError
# subclasses), 404 NotFoundError, 413 ContentTooLargeError, 401 AuthenticationError,
# 403 PermissionDeniedError, 400 BadRequestError; 405 and 415 are plain APIStatusError.
ERRORS: dict[ErrorKind, ErrorSpec] = {
    ErrorKind.QUEUE_SATURATED: ErrorSpec(
        529, "overloaded_error", "queue_saturated", grpc.StatusCode.RESOURCE_EXHAUSTED,
        "overloaded_error",
    ),
    ErrorKind.ENGINE_UNAVAILABLE: ErrorSpec(
        503, "server_error", "engine_unavailable", grpc.StatusCode.UNAVAILABLE, "api_error"
    ),
    ErrorKind.MODEL_NOT_FOUND: ErrorSpec(
        404, "invalid_request_error", "model_not_found", grpc.StatusCode.NOT_FOUND,
        "not_found_error",
    ),
    # A replica index no model has here (its port is gone), or not one of this model.
    ErrorKind.REPLICA_NOT_FOUND: ErrorSpec(404, "invalid_request_error", "replica_not_found", None),
    # The replica exists but admits nothing yet or any more (starting, draining, scaled to 0).
    ErrorKind.REPLICA_UNAVAILABLE: ErrorSpec(503, "server_error", "replica_unavailable", None),
    # Sleep mode: the replica sleeps (POST /sleep) until POST /wake_up.
    ErrorKind.ENGINE_SLEEPING: ErrorSpec(503, "server_error", "engine_sleeping", None, "api_error"),
    # P/D: a do_remote_decode prefill on a replica whose handoffs hold their share of its KV
    # cache (--kv-hold-share). A 503, as vLLM answers a server that cannot take the work
    # now: the OpenAI SDK and vllm-router retry it; not a 529 (the queue is not full, and
    # clients shed ordinary load on a 529) nor a 429 (no client's rate is at fault).
    ErrorKind.KV_TRANSFER_FULL: ErrorSpec(503, "server_error", "kv_transfer_full", None,
                                          "api_error"),
    ErrorKind.INVALID_REQUEST: ErrorSpec(
        400, "invalid_request_error", "invalid_request", grpc.StatusCode.INVALID_ARGUMENT
    ),
    # An x-inference-lab-fault header that cannot be honoured (gateway.faults.directive).
    ErrorKind.INVALID_FAULT_DIRECTIVE: ErrorSpec(
        400, "invalid_request_error", "invalid_fault_directive", None
    ),
    # A request body that did not arrive in time (gateway.edge).
    ErrorKind.REQUEST_TIMEOUT: ErrorSpec(408, "invalid_request_error", "request_timeout", None),
    ErrorKind.BODY_TOO_LARGE: ErrorSpec(
        413, "invalid_request_error", "request_too_large", None, "request_too_large"
    ),
    ErrorKind.UNSUPPORTED_MEDIA_TYPE: ErrorSpec(
        415, "invalid_request_error", "unsupported_media_type", None
    ),
    ErrorKind.UNAUTHORIZED: ErrorSpec(
        401, "authentication_error", "invalid_api_key", None, "authentication_error"
    ),
    # /control/* without the control token, or the engine refusing the gateway's (SetCapacity).
    ErrorKind.CONTROL_UNAUTHORIZED: ErrorSpec(
        401, "authentication_error", "invalid_control_token", grpc.StatusCode.UNAUTHENTICATED,
        "authentication_error",
    ),
    # A control route asked from a web page (a request with an Origin header).
    ErrorKind.CROSS_ORIGIN_FORBIDDEN: ErrorSpec(
        403, "permission_error", "cross_origin_forbidden", None, "permission_error"
    ),
    ErrorKind.ROUTE_NOT_FOUND: ErrorSpec(
        404, "invalid_request_error", "not_found", None, "not_found_error"
    ),
    ErrorKind.METHOD_NOT_ALLOWED: ErrorSpec(
        405, "invalid_request_error", "method_not_allowed", None
    ),
    ErrorKind.INTERNAL: ErrorSpec(
        500, "server_error", "internal_error", grpc.StatusCode.INTERNAL, "api_error"
    ),
    # A Responses request's previous_response_id that this gateway does not hold.
    ErrorKind.PREVIOUS_RESPONSE_NOT_FOUND: ErrorSpec(
        404, "invalid_request_error", "previous_response_not_found", None, "not_found_error"
    ),
    # GET or DELETE /v1/responses/{id} of a response this gateway does not hold.
    ErrorKind.RESPONSE_NOT_FOUND: ErrorSpec(
        404, "invalid_request_error", "response_not_found", None, "not_found_error"
    ),
}

_KIND_BY_GRPC: dict[grpc.StatusCode, ErrorKind] = {
    spec.grpc_code: kind for kind, spec in ERRORS.items() if spec.grpc_code is not None
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


# What a saturated model may answer instead of the 529 (`Saturation`): 503 and 429 are
# what other servers and simulators send when they are full. The code stays
# queue_saturated, so a client can tell a full queue from a liveness failure (503
# engine_unavailable) or an injected rate limit (429 rate_limit_exceeded); the Anthropic
# type follows Anthropic's documented types (its SDK picks the exception by status:
# 503 ServiceUnavailableError, 429 RateLimitError).
SATURATED_SPECS: dict[int, ErrorSpec] = {
    529: ERRORS[ErrorKind.QUEUE_SATURATED],
    503: ErrorSpec(503, "overloaded_error", "queue_saturated",
                   grpc.StatusCode.RESOURCE_EXHAUSTED, "overloaded_error"),
    429: ErrorSpec(429, "overloaded_error", "queue_saturated",
                   grpc.StatusCode.RESOURCE_EXHAUSTED, "rate_limit_error"),
}


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
    spec = err.spec
    return _json_encode({"error": {"message": err.message, "type": spec.type, "code": spec.code}})


def anthropic_envelope(err: GatewayError) -> bytes:
    """Anthropic's error body: `{"type": "error", "error": {"type", "message"}}` (and
    `details`, `{"error_code", ...}`, which the anthropic SDK reads, when the error has them)."""
    error = {"type": err.spec.anthropic_type, "message": err.message}
    if err.details:
        error["details"] = err.details
    return _json_encode({"type": "error", "error": error})


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
