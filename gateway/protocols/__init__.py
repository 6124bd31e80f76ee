"""The client-facing generation APIs, one module per dialect, over one engine path.

- `base`: the contract (`Dialect` parses a body into a `Generation` with its `Reply`,
  which renders the response bytes), the lab's tokenizer, SSE framing.
- `openai`: chat completions (a forced tool call: `ChatToolCall`) and completions (`n`
  choices, `echo`): its request `schemas` apart from its response `render`ing.
- `anthropic`: the Anthropic Messages API, with Anthropic's error envelope.
- `responses`: the OpenAI Responses API (text or a forced function call, typed stream events).
- `stored_responses`: GET / DELETE `/v1/responses/{id}` of the Responses API's store.
- `count_tokens`: Anthropic's `POST /v1/messages/count_tokens`, with `anthropic`'s prompt.
- `generate`: the shared engine path: admission (529 before any byte), streaming paced by
  the engine's progress, cancellation when the client leaves.
- `vllm_generate`: vLLM's tokens-in, tokens-out `/inference/v1/generate`.
- `pooling`: vLLM's pooling routes (embeddings, pooling, score, rerank), each a batch of
  pooling requests on the same path (`batch`).

`ROUTES` maps each generation and pooling route to its dialect; `gateway.app` registers
them and renders errors on a route in that route's envelope.
"""

from inference_lab.gateway.protocols.anthropic import MESSAGES
from inference_lab.gateway.protocols.base import Dialect
from inference_lab.gateway.protocols.openai import CHAT, COMPLETIONS
from inference_lab.gateway.protocols.pooling import POOLING_ROUTES
from inference_lab.gateway.protocols.responses import RESPONSES
from inference_lab.gateway.protocols.vllm_generate import GENERATE

ROUTES: dict[str, Dialect] = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETIONS,
    "/v1/messages": MESSAGES,
    "/v1/responses": RESPONSES,
    "/inference/v1/generate": GENERATE,
    **POOLING_ROUTES,
}

__all__ = ["ROUTES", "Dialect"]
