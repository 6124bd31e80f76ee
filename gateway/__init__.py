"""The gateway: OpenAI- and Anthropic-compatible HTTP (aiohttp) in front of the engine's gRPC API.

HTTP <-> gRPC translation only. It holds no scheduling state: the engine is the single
source of truth for queue depth and capacity. Modules:

- `errors`: the one table from error kind to HTTP status, OpenAI type/code, Anthropic type,
  gRPC code.
- `engine_client`: one grpc.aio channel and ONE multiplexed Session stream for all requests.
- `protocols`: one module per API dialect (OpenAI chat/completions, OpenAI Responses,
  Anthropic Messages: request schemas, token counting, pre-encoded SSE templates) and the
  one engine path they share (`protocols.generate`).
- `app`: the aiohttp application factory, routes, metrics and lifecycles.
- `server`: `start_gateway`, serving one app; `fleet`: one app per engine replica;
  `run`: `run_gateway`, running them until cancelled.
- `aiohttp_gate`: every read or write of aiohttp's private state (the edge's answers, the
  relay's writes, receive stamps), on only for the aiohttp releases it was tested on.
"""

from inference_lab.gateway.app import create_app
from inference_lab.gateway.run import run_gateway

__all__ = ["create_app", "run_gateway"]
