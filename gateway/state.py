"""The gateway app's state: one typed value per app (aiohttp's `web.AppKey`).

Knows: what an app of the gateway is configured with (the engine's address, body limit,
API key, control token, faults, tokenizer, the replica it fronts, how a saturated model
answers, whether responses name their replica), its engine client
while it runs (gateway.lifecycle), the engine requests in flight with their HTTP requests,
and the gateway's own series (gateway.metrics).

Does not know: routes (gateway.app), what the handlers do with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from inference_lab.common.tokenizer import Tokenizer, load_tokenizer
from inference_lab.gateway.engine_client import EngineClient, RequestStream
from inference_lab.gateway.errors import SATURATED_529, Saturation, engine_unavailable
from inference_lab.gateway.faults import FaultSpec
from inference_lab.gateway.metrics import GatewayMetrics


@dataclass(slots=True)
class GatewayState:
    engine_target: str
    max_body_bytes: int
    api_key: str | None
    disconnect_poll_s: float
    control_token: str | None = None
    session_lane: str | None = None  # EngineClient's: "auto", "off" (None: its default)
    enable_directives: bool = False  # honour x-inference-lab-fault headers
    static_faults: dict[str, FaultSpec] = field(default_factory=dict)  # model -> [fault] mode
    tokenizer: Tokenizer = field(default_factory=lambda: load_tokenizer(None))
    # The replica this app fronts (gateway.fleet: one app per replica port); None = the
    # engine's default replica, with no readiness checks (a lone gateway, as before replicas).
    replica: int | None = None
    shared_engine: EngineClient | None = None  # owned by the caller (gateway.fleet), not the app
    saturation: Saturation = SATURATED_529  # a saturated model's status and Retry-After
    served_by: bool = True  # generation responses name their replica and model (headers)
    # the replicas are data-parallel ranks of one server (each says its rank), not
    # independent servers (each says rank 0, as a vLLM server of its own does)
    data_parallel: bool = False
    inflight: dict[RequestStream, web.BaseRequest] = field(default_factory=dict)
    metrics: GatewayMetrics = field(init=False)
    engine: EngineClient | None = None

    def __post_init__(self) -> None:
        self.metrics = GatewayMetrics(self.inflight)

    @property
    def client(self) -> EngineClient:
        if self.engine is None:
            raise engine_unavailable("the gateway is not started")
        return self.engine


STATE: web.AppKey[GatewayState] = web.AppKey("gateway_state", GatewayState)
