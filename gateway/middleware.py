"""What every request of a gateway app passes: the edge middleware, and the JSON body.

Knows: the API key (a Bearer token or `x-api-key`, on /v1/*), the control token (on the
control routes, which also refuse browsers but the gateway's own page, and bodies not
labelled JSON: gateway.access),
errors in the envelope of the route's dialect (gateway.protocols.ROUTES), a saturated
model's refusal with the app's status (errors.Saturation), metrics by route and status, a
client who left (499 in the metrics), `x-request-id` on every response (the client's own
when it sent one) and the replica and model on a generation response, what a JSON body
must be to be read (its Content-Type, the size limit), and each request's hold on the
backlog (`HOLD`, gateway.backlog), released once it is answered at the latest.

Does not know: what the handlers do, the error table itself (gateway.errors), gRPC.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from inference_lab.common.auth import Access, accepted, bearer_ok
from inference_lab.gateway import cors
from inference_lab.gateway.access import json_labelled, route_access, same_origin_page
from inference_lab.gateway.backlog import Hold
from inference_lab.gateway.edge import read_body
from inference_lab.gateway.engine_client import ClientGone
from inference_lab.gateway.errors import ErrorKind, GatewayError, error_response, from_http_exception
from inference_lab.gateway.errors import envelope as openai_envelope
from inference_lab.gateway.protocols import ROUTES
from inference_lab.gateway.protocols.base import random_id
from inference_lab.gateway.state import STATE

log = logging.getLogger("inference_lab.gateway.app")  # the app's lines

CLIENT_CLOSED_STATUS = 499  # recorded in metrics when the client left before the response


def _route_label(request: web.BaseRequest) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


_BODILESS = frozenset({"GET", "HEAD", "OPTIONS"})
_BY_ROUTE: dict[str, Access] = {}  # a route's access, by its canonical path (few: the routes)


def _access(request: web.BaseRequest, label: str) -> Access:
    """The access of the route the request matched (`label`: _route_label's; its path's,
    when none matched)."""
    access = _BY_ROUTE.get(label)
    if access is None:
        if label == "unmatched":
            return route_access(request.path)
        access = _BY_ROUTE[label] = route_access(label)
    return access


def _check_access(request: web.BaseRequest, label: str, api_key: str | None,
                  control_token: str | None) -> None:
    """Raise the 401, 403 or 415 an access rule gives this request (gateway.access)."""
    access = _access(request, label)
    if access is Access.OPEN:
        return
    if access is Access.GENERATE:
        if api_key is not None and not cors.is_preflight(request) \
                and not _api_key_ok(request, api_key):
            raise GatewayError(ErrorKind.UNAUTHORIZED, "Invalid or missing API key.")
    elif access is Access.CONTROL:
        origin = request.headers.get("Origin")
        if origin is not None and (cors.is_preflight(request) or not same_origin_page(
                origin, request.host, request.scheme, request.headers.get("Sec-Fetch-Site"))):
            # a web page's request (a preflight too), unless the gateway's own page's
            raise GatewayError(ErrorKind.CROSS_ORIGIN_FORBIDDEN,
                               "Control routes answer no cross-origin request.")
        secrets = accepted(Access.CONTROL, api_key, control_token)
        authorization = request.headers.get("Authorization")
        if secrets and not any([bearer_ok(authorization, secret) for secret in secrets]):
            raise GatewayError(ErrorKind.CONTROL_UNAUTHORIZED, "Invalid or missing control token."
                               if control_token else "Invalid or missing control token (this "
                               "server has none: its API key stands in).")
        if request.method not in _BODILESS and not _no_body(request) and not json_labelled(
                request.headers.get("Content-Type")):
            raise GatewayError(ErrorKind.UNSUPPORTED_MEDIA_TYPE,
                               "A control route takes a JSON body with Content-Type: "
                               "application/json.")


def _no_body(request: web.BaseRequest) -> bool:
    """A POST with no body and no Content-Type, as vLLM's `/sleep?level=1` and `/wake_up`
    are sent (their parameters are in the query): nothing to label. A browser's POST
    carries an `Origin`, refused before this unless it is the gateway's own page's."""
    return not request.body_exists and "Content-Type" not in request.headers


def _api_key_ok(request: web.BaseRequest, api_key: str) -> bool:
    """`Authorization: Bearer KEY` (OpenAI's clients) or `x-api-key: KEY` (Anthropic's)."""
    x_api_key = request.headers.get("x-api-key")
    if x_api_key is not None and bearer_ok("Bearer " + x_api_key, api_key):
        return True
    return bearer_ok(request.headers.get("Authorization"), api_key)


def _envelope_for(request: web.BaseRequest):
    """The error body renderer of the route's API dialect (OpenAI's by default)."""
    dialect = ROUTES.get(_route_label(request))
    if dialect is None and request.path.startswith("/v1/messages"):
        dialect = ROUTES["/v1/messages"]  # e.g. an unknown sub-route: Anthropic's clients
    return dialect.error_body if dialect is not None else openai_envelope


def _error_response(err: GatewayError, request: web.BaseRequest) -> web.Response:
    """`err` in the envelope of the request's route (looked up only when there is one); a
    saturated model's refusal with the app's saturation status."""
    err = request.app[STATE].saturation.apply(err)
    return error_response(err, request, _envelope_for(request))


@web.middleware
async def edge_middleware(request: web.Request, handler) -> web.StreamResponse:
    state = request.app[STATE]
    started = time.perf_counter()
    status = 500
    label = _route_label(request)
    engine = state.engine
    # the request's hold on the backlog (gateway.backlog): released once it is answered,
    # if the generation path has not released it before (sent, or a scripted fault)
    hold = request[HOLD] = Hold(engine.backlog if engine is not None else None,
                                request.protocol)
    try:
        _check_access(request, label, state.api_key, state.control_token)
        try:
            resp = await handler(request)
        except GatewayError as err:
            resp = _error_response(err, request)
        except web.HTTPException as exc:
            if exc.status < 400:  # redirects pass through
                status = exc.status
                raise
            resp = _error_response(from_http_exception(exc), request)
        except ClientGone:
            log.debug("%s %s: client went away; engine request cancelled",
                      request.method, request.path)
            resp = web.Response(status=CLIENT_CLOSED_STATUS)
        except asyncio.CancelledError:
            status = CLIENT_CLOSED_STATUS
            raise
        except Exception:
            log.exception("unhandled error in %s %s", request.method, request.path)
            resp = _error_response(GatewayError(ErrorKind.INTERNAL, "Internal server error."),
                                   request)
        status = resp.status
        return resp
    except GatewayError as err:  # refused before the handler (auth)
        resp = _error_response(err, request)
        status = resp.status
        return resp
    finally:
        hold.release()
        state.metrics.observe(label, status, time.perf_counter() - started)


# Bodies read as JSON besides application/*+json: unlabelled ones, and curl's default for
# `-d` (so `curl -d '{...}'` works without `-H content-type:`). Anything else is a 415.
_UNLABELLED = ("octet-stream", "x-www-form-urlencoded")


def _may_be_json(request: web.BaseRequest) -> bool:
    """application/json or application/*+json, or no Content-Type, or an unlabelled one
    (parameters ignored). Text, multipart, XML and garbage are refused."""
    return json_media(request.headers.get("Content-Type"))


def json_media(header: str | None) -> bool:
    """`_may_be_json` of a Content-Type header's value."""
    if header is None or header == "application/json":
        return True
    maintype, _, subtype = header.partition(";")[0].strip().lower().partition("/")
    return maintype == "application" and "/" not in subtype and (
        subtype == "json" or subtype.endswith("+json") or subtype in _UNLABELLED)


async def read_json_body(request: web.Request, limit: int) -> bytes:
    """The request's body, if it may be JSON and is within `limit` bytes (else the 415 or
    413 as a GatewayError)."""
    if not _may_be_json(request):
        raise GatewayError(ErrorKind.UNSUPPORTED_MEDIA_TYPE,
                           f"Unsupported Content-Type {request.headers['Content-Type']!r}: "
                           "send a JSON body with Content-Type: application/json.")
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit)
    try:
        return await read_body(request)
    except web.HTTPRequestEntityTooLarge:
        raise _too_large(limit) from None


def _too_large(limit: int) -> GatewayError:
    return GatewayError(ErrorKind.BODY_TOO_LARGE,
                        f"Request body too large: the limit is {limit} bytes.")


async def echo_request_id(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """Every response carries `x-request-id`: the client's own when it sent one; a
    generation response the replica and model that answered it (`SERVED_BY`)."""
    if "x-request-id" not in response.headers:
        response.headers["x-request-id"] = request.headers.get("x-request-id") or random_id()
    served = request.get(SERVED_BY)
    if served is not None:
        replica, model = served
        response.headers[REPLICA_HEADER] = replica
        if model is not None:
            response.headers[MODEL_HEADER] = model


# A generation request's (replica, model), set by its handler once the body is parsed
# (unless the app was told not to: --no-served-by-headers), named on its response (the
# model None when the client's name cannot be a header value).
SERVED_BY = (web.RequestKey("served_by", tuple) if hasattr(web, "RequestKey")  # aiohttp >= 3.12
             else "inference_lab.served_by")
REPLICA_HEADER = "x-inference-lab-replica"
# A request's hold on the gateway's backlog (gateway.backlog), set by the middleware.
HOLD = (web.RequestKey("arrival_hold", Hold) if hasattr(web, "RequestKey")  # aiohttp >= 3.12
        else "inference_lab.arrival_hold")
MODEL_HEADER = "x-inference-lab-model"
