"""The gateway: OpenAI- and Anthropic-compatible HTTP (aiohttp) in front of the engine's gRPC API.

HTTP <-> gRPC translation. The engine is the single source of truth for queue depth and
capacity, and decides every admission; the gateway keeps two copies of what concerns it:
the engine's announced "full" spans (`admission`: a request whose arrival lies in one is
refused here with the engine's own text, without a round trip, and reported back for the
engine's counts) and its backlog of requests read and not yet sent (`backlog`: the hold,
so that the engine does not decide past a request this gateway has not forwarded yet).
Modules:

- `errors`: the one table from error kind to HTTP status, OpenAI type/code, Anthropic type,
  gRPC code.
- `engine_client`: one grpc.aio channel and ONE multiplexed Session stream for all requests.
- `admit`: a generation request's one admission decision (refused here on the engine's
  word, or sent), taken by the handler and the edge's fast path alike.
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
