"""The one error table: every kind of failure the lab reports to an HTTP client, each
mapped once to (HTTP status, OpenAI error `type`, `code`, Anthropic error `type`, the
name of the gRPC status code that carries it from the engine), and the two envelopes a
client reads: OpenAI's `{"error": {"message", "type", "code"}}` and Anthropic's
`{"type": "error", "error": {"type", "message"}}`.

Used by the gateway (gateway.errors: its exceptions, the translation of engine statuses,
the aiohttp responses) and by the virtual-time lab (experiments.virtual), so a refusal
reads the same whichever answers it.

Does not know: routes, aiohttp, gRPC (a status code is named, not imported), logging.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping

import msgspec

__all__ = ["ErrorKind", "ErrorSpec", "ERRORS", "SATURATED_SPECS", "openai_envelope",
           "anthropic_envelope"]

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
    BAD_HTTP_REQUEST = "bad_http_request"
    HEADERS_TOO_LARGE = "headers_too_large"
    NOT_IMPLEMENTED = "not_implemented"
    HTTP_VERSION_NOT_SUPPORTED = "http_version_not_supported"


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    status: int  # HTTP status
    type: str  # OpenAI error type
    code: str  # OpenAI error code
    grpc_code: str | None  # the name of the engine's gRPC status code that means this kind, if any
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
        529, "overloaded_error", "queue_saturated", "RESOURCE_EXHAUSTED",
        "overloaded_error",
    ),
    ErrorKind.ENGINE_UNAVAILABLE: ErrorSpec(
        503, "server_error", "engine_unavailable", "UNAVAILABLE", "api_error"
    ),
    ErrorKind.MODEL_NOT_FOUND: ErrorSpec(
        404, "invalid_request_error", "model_not_found", "NOT_FOUND",
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
        400, "invalid_request_error", "invalid_request", "INVALID_ARGUMENT"
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
        401, "authentication_error", "invalid_control_token", "UNAUTHENTICATED",
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
        500, "server_error", "internal_error", "INTERNAL", "api_error"
    ),
    # A Responses request's previous_response_id that this gateway does not hold.
    ErrorKind.PREVIOUS_RESPONSE_NOT_FOUND: ErrorSpec(
        404, "invalid_request_error", "previous_response_not_found", None, "not_found_error"
    ),
    # GET or DELETE /v1/responses/{id} of a response this gateway does not hold.
    ErrorKind.RESPONSE_NOT_FOUND: ErrorSpec(
        404, "invalid_request_error", "response_not_found", None, "not_found_error"
    ),
    # What the gateway's HTTP parser (aiohttp's) refuses before there is a request.
    ErrorKind.BAD_HTTP_REQUEST: ErrorSpec(400, "invalid_request_error", "bad_http_request", None),
    ErrorKind.HEADERS_TOO_LARGE: ErrorSpec(431, "invalid_request_error", "headers_too_large", None),
    ErrorKind.NOT_IMPLEMENTED: ErrorSpec(501, "server_error", "not_implemented", None, "api_error"),
    ErrorKind.HTTP_VERSION_NOT_SUPPORTED: ErrorSpec(
        505, "server_error", "http_version_not_supported", None, "api_error"
    ),
}


# What a saturated model may answer instead of the 529 (gateway.errors.Saturation): 503
# and 429 are what other servers and simulators send when they are full. The code stays
# queue_saturated, so a client can tell a full queue from a liveness failure (503
# engine_unavailable) or an injected rate limit (429 rate_limit_exceeded); the Anthropic
# type follows Anthropic's documented types (its SDK picks the exception by status:
# 503 ServiceUnavailableError, 429 RateLimitError).
SATURATED_SPECS: dict[int, ErrorSpec] = {
    529: ERRORS[ErrorKind.QUEUE_SATURATED],
    503: ErrorSpec(503, "overloaded_error", "queue_saturated", "RESOURCE_EXHAUSTED",
                   "overloaded_error"),
    429: ErrorSpec(429, "overloaded_error", "queue_saturated", "RESOURCE_EXHAUSTED",
                   "rate_limit_error"),
}


def openai_envelope(spec: ErrorSpec, message: str) -> bytes:
    """OpenAI's error body for a row of the table."""
    return _json_encode({"error": {"message": message, "type": spec.type, "code": spec.code}})


def anthropic_envelope(spec: ErrorSpec, message: str,
                       details: Mapping[str, object] | None = None) -> bytes:
    """Anthropic's error body: `{"type": "error", "error": {"type", "message"}}` (and
    `details`, `{"error_code", ...}`, which the anthropic SDK reads, when given)."""
    error = {"type": spec.anthropic_type, "message": message}
    if details:
        error["details"] = details
    return _json_encode({"type": "error", "error": error})
