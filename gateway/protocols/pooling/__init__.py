"""vLLM's pooling routes: embeddings, pooling, scores and reranking, as dialects of the one
engine path.

- `requests`: the bodies (msgspec schemas), their inputs as token IDs, and vLLM's rules
  once the model is known (the kind of model a route needs, truncation, the longest
  input, matryoshka `dimensions`): a `Job`.
- `replies`: the responses in vLLM's shapes.
- `vectors`: the numbers: deterministic embeddings per model and input, scores.

Every request is a `Batch` of pooling requests (engine max_tokens 0: its prefill, nothing
generated), one per input (per pair on a cross-encoder, per text on an embedding model),
admitted all or none and answered in one response, through the engine path of every
route (gateway.generation, gateway.protocols.batch): the same 529 before any byte, the
same metrics by route. `POOLING_ROUTES` maps each route to its dialect.

Does not know: aiohttp, gRPC, or the engine's events.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from inference_lab.common.tokenizer import Tokenizer
from inference_lab.gateway.protocols.base import Batch, Dialect, Generation
from inference_lab.gateway.protocols.pooling.replies import PoolingReply
from inference_lab.gateway.protocols.pooling.requests import (
    Job, embeddings_job, pooling_job, prepare, rerank_job, score_job,
)


class PoolingDialect(Dialect):
    """One pooling route: its body as a `Job`, run as a batch of pooling requests."""

    def __init__(self, name: str, api: str, parse_job: Callable[[bytes, Tokenizer], tuple[Job, int]]) -> None:
        self.name = name
        self.api = api
        self._parse_job = parse_job

    def parse(self, body: bytes, tokenizer: Tokenizer) -> Batch:
        job, priority = self._parse_job(body, tokenizer)
        return Batch(job.model, job.prompts, 0, False, partial(PoolingReply, job),
                     priority=priority, where=job.where, job=job)

    def check(self, gen: Generation | Batch, model) -> None:
        """The model's kind and everything else that depends on it (vLLM's 400s); sets the
        batch's engine requests (its prompts)."""
        job = gen.job
        prepare(job, model)
        gen.prompts = job.prompts


EMBEDDINGS = PoolingDialect("vllm.embeddings", "Embeddings", embeddings_job)
POOLING = PoolingDialect("vllm.pooling", "Pooling", pooling_job)
SCORE = PoolingDialect("vllm.score", "Score", score_job)
RERANK = PoolingDialect("vllm.rerank", "Rerank", rerank_job)

POOLING_ROUTES: dict[str, Dialect] = {
    "/v1/embeddings": EMBEDDINGS,
    "/pooling": POOLING,
    "/score": SCORE,
    "/v1/score": SCORE,
    "/rerank": RERANK,
    "/v1/rerank": RERANK,
    "/v2/rerank": RERANK,
}

__all__ = ["POOLING_ROUTES", "PoolingDialect"]
