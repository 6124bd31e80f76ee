"""Which secret each RPC of the engine needs, checked once per call before its handler.

Knows: the access of every method of the Engine service (`RPC_ACCESS`, and vLLM's
VllmEngine's in `VLLM_RPC_ACCESS`: a call that generates
or hands out the Session lane's token needs the API key or the control token; one that
changes state needs the control token; reads are open), that the health and reflection
services are open, and the rules of each kind (inference_lab.common.auth). `AccessGuard`
is a server interceptor: a call without a secret its method accepts is answered
UNAUTHENTICATED (reason UNAUTHENTICATED in its google.rpc.ErrorInfo) and its handler never
runs. A method of either service missing from its table needs the control token, so a
new RPC is never open by mistake. The check costs one lookup per call (a Session is one
call, whatever it carries).

Does not know: what the calls do (engine.service.rpc, engine.service.control).
"""

from __future__ import annotations

import grpc

from inference_lab.common.auth import Access, accepted, bearer_ok
from inference_lab.engine.service.refusals import Unauthenticated, refusal_status
from inference_lab.v1 import engine_pb2
from inference_lab.vllm_grpc import vllm_engine_pb2

ENGINE_SERVICE = engine_pb2.DESCRIPTOR.services_by_name["Engine"].full_name
VLLM_SERVICE = vllm_engine_pb2.DESCRIPTOR.services_by_name["VllmEngine"].full_name
OPEN_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                 "grpc.reflection.v1.ServerReflection")

# Every method of the Engine service and the access it needs (docs/security.md has the table).
RPC_ACCESS: dict[str, Access] = {
    "Submit": Access.GENERATE,
    "Session": Access.GENERATE,
    "SessionLane": Access.GENERATE,  # hands out the lane's token: the Session by another door
    "GetCapacity": Access.OPEN,
    "SetCapacity": Access.CONTROL,
    "ListModels": Access.OPEN,
    "LoadLoraAdapter": Access.CONTROL,
    "UnloadLoraAdapter": Access.CONTROL,
    "SetReplicas": Access.CONTROL,
    "Sleep": Access.CONTROL,  # vLLM's sleep mode: a replica frees its memory and refuses
    "Pause": Access.CONTROL,  # vLLM's dev-mode /pause, /resume: requests aborted or held
    "ResetPrefixCache": Access.CONTROL,  # vLLM's dev-mode /reset_prefix_cache
    "GetMetrics": Access.OPEN,
    "WatchMetrics": Access.OPEN,
    "InjectFault": Access.CONTROL,
    "GetFaultState": Access.OPEN,
    "GetKvEventSources": Access.OPEN,  # where the KV events are published (read only)
}

# vLLM's engine service (engine.service.vllm_grpc): what generates, or cancels generation,
# needs what Submit needs; the reads are open.
VLLM_RPC_ACCESS: dict[str, Access] = {
    "Generate": Access.GENERATE,
    "Embed": Access.GENERATE,
    "Abort": Access.GENERATE,
    "HealthCheck": Access.OPEN,
    "GetModelInfo": Access.OPEN,
    "GetServerInfo": Access.OPEN,
}
_TABLES = {ENGINE_SERVICE: RPC_ACCESS, VLLM_SERVICE: VLLM_RPC_ACCESS}

_KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


def method_access(full_method: str) -> Access:
    """The access of `/package.Service/Method` (a method missing from its service's table:
    CONTROL)."""
    service, _, name = full_method.lstrip("/").rpartition("/")
    rules = _TABLES.get(service)
    if rules is not None:
        return rules.get(name, Access.CONTROL)
    return Access.OPEN if service in OPEN_SERVICES else Access.CONTROL


class AccessGuard(grpc.aio.ServerInterceptor):
    """Refuses a call without a secret its method accepts, before its handler runs."""

    def __init__(self, api_key: str | None = None, control_token: str | None = None) -> None:
        self._secrets: dict[Access, tuple[bytes, ...]] = {}
        self._names: dict[Access, str] = {}  # what a refusal says to send
        for access in Access:
            secrets = accepted(access, api_key, control_token)
            self._secrets[access] = tuple(s.encode() for s in secrets)
            self._names[access] = " or ".join(
                name for secret, name in ((api_key, "API key"), (control_token, "control token"))
                if secret and secret in secrets)
        self._guarding = bool(api_key or control_token)

    def allows(self, full_method: str, metadata) -> bool:
        secrets = self._secrets[method_access(full_method)]
        if not secrets:
            return True
        for key, value in metadata or ():
            if key == "authorization":
                # every secret compared (constant time each), whichever matches
                if sum(bearer_ok(value, secret) for secret in secrets):
                    return True
        return False

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if not self._guarding:  # no secrets: nothing to check
            return handler
        method = handler_call_details.method
        if handler is None or self.allows(method, handler_call_details.invocation_metadata):
            return handler
        name = method.rpartition("/")[2]
        status = refusal_status(Unauthenticated(
            f"{name} needs metadata `authorization: Bearer <"
            f"{self._names[method_access(method)]}>`"))

        async def refuse(request, context):
            await context.abort(status.code, status.details, status.trailing_metadata)

        for kind in _KINDS:
            if getattr(handler, kind) is not None:
                return handler._replace(**{kind: refuse})
        return handler
