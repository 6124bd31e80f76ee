"""Malformed request messages become INVALID_ARGUMENT, never UNKNOWN.

Knows: grpc.aio's handler records. A request whose bytes do not parse as its protobuf type
(corrupt wire format, a string field with bad UTF-8) would otherwise reach grpc.aio's
catch-all as a DecodeError and come back as UNKNOWN with the exception's class in the
details. `DecodeGuard` wraps every async handler of the server: the deserializer returns a
`Malformed` marker instead of raising, and the handler answers INVALID_ARGUMENT with a
plain message. A malformed message inside a request stream (Session) ends that call the
same way, once the handler's iteration reaches it.

Does not know: the engine's services or messages. Handlers that read a request stream with
`context.read()` instead of iterating it see the `Malformed` marker themselves.
"""

from __future__ import annotations

import inspect
from typing import Any, AsyncIterator, Callable

import grpc
from google.protobuf.message import DecodeError


class Malformed:
    """What the guarded deserializer returns for bytes that do not parse."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


class MalformedMessage(ValueError):
    """Raised inside a guarded handler when it meets a Malformed request."""


def _tolerant(deserializer: Callable[[bytes], Any] | None):
    if deserializer is None:
        return None

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError as exc:
            return Malformed(f"malformed request message: {exc}")

    return deserialize


def _checked(request: Any) -> Any:
    if isinstance(request, Malformed):
        raise MalformedMessage(request.message)
    return request


async def _checked_stream(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        yield _checked(request)


def _guard(behavior: Callable, streaming_request: bool) -> Callable | None:
    """`behavior` with requests checked; None when it is not an async handler."""
    check = _checked_stream if streaming_request else _checked

    if inspect.isasyncgenfunction(behavior):
        async def generator(request, context):
            try:
                async for response in behavior(check(request), context):
                    yield response
            except MalformedMessage as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return generator

    if inspect.iscoroutinefunction(behavior):
        async def coroutine(request, context):
            try:
                return await behavior(check(request), context)
            except MalformedMessage as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return coroutine
    return None


_KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


class DecodeGuard(grpc.aio.ServerInterceptor):
    """Answers undecodable requests with INVALID_ARGUMENT on every async handler."""

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        for kind in _KINDS:
            behavior = getattr(handler, kind)
            if behavior is None:
                continue
            guarded = _guard(behavior, handler.request_streaming)
            if guarded is None:  # a sync handler: left as grpc runs it
                return handler
            return handler._replace(**{kind: guarded},
                                    request_deserializer=_tolerant(handler.request_deserializer))
        return handler
