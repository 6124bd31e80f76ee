"""The responses of vLLM's pooling routes, in vLLM's shapes.

Knows: `EmbeddingResponse` {id "embd-...", object "list", created, model, data [{index,
object "embedding", embedding}], usage}, `PoolingResponse` (id "pool-...", data [{index,
object "pooling", data}]), `ScoreResponse` (id "score-...", data [{index, object
"score", score}]) and `RerankResponse` {id "rerank-...", model, usage {prompt_tokens,
total_tokens}, results [{index, document {text}, relevance_score}] by relevance, the top
`top_n`}; usage counts the prompt tokens the engine prefilled (a score of an embedding
model: each pair's query and document, as vLLM counts them); the engine's modelled
timings under "inference_lab" as on every route. The numbers are
gateway.protocols.pooling.vectors'.

Does not know: request bodies (gateway.protocols.pooling.requests), aiohttp, gRPC.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from inference_lab.gateway.errors import GatewayError, sse_error_frame
from inference_lab.gateway.protocols.base import BatchReply, Outcome, json_encode, random_id
from inference_lab.gateway.protocols.openai.render import batch_modelled
from inference_lab.gateway.protocols.pooling.requests import Job
from inference_lab.gateway.protocols.pooling.vectors import (
    cosine, cross_logit, cross_logits, embedding, encode, sigmoid,
)

# A response is written in pieces of about this many bytes (gateway.protocols.batch): an
# embeddings response of 2,048 float vectors of 1,024 values is ~45 MB as JSON.
CHUNK_BYTES = 64 * 1024
_PREFIX = {"embed": "embd", "pool": "pool", "score": "score", "rerank": "rerank"}


class PoolingReply(BatchReply):
    """The one response of a pooling request (never streamed: `body` only)."""

    __slots__ = ("id", "parts", "job", "created")

    def __init__(self, job: Job) -> None:
        self.job = job
        self.id = f"{_PREFIX[job.kind]}-{random_id()}"
        self.parts = []
        self.created = int(time.time())

    def closing(self, outcomes: list[Outcome]) -> bytes:
        return self.body(outcomes)

    def error_frame(self, err: GatewayError) -> bytes:
        return sse_error_frame(err)

    def body(self, outcomes: list[Outcome]) -> bytes:
        return b"".join(self.chunks(outcomes))

    def chunks(self, outcomes: list[Outcome], size: int = CHUNK_BYTES) -> Iterator[bytes]:
        """`body(outcomes)` in pieces of about `size` bytes (one vector more at most), each
        made when asked for: an embeddings or pooling response of thousands of vectors is
        written piece by piece, never held whole. A score or rerank response (a number
        per pair) is one piece."""
        job = self.job
        prompt_tokens = sum(o.prompt_tokens for o in outcomes)
        if job.kind not in ("embed", "pool"):
            yield self._scored(outcomes, prompt_tokens)
            return
        head = {"id": self.id, "object": "list", "created": self.created, "model": job.model}
        piece = [json_encode(head)[:-1], b',"data":[']  # (the object left open)
        held = 0
        for i, item in enumerate(self._vectors()):
            encoded = json_encode(item)
            piece.append(b"," + encoded if i else encoded)
            held += len(encoded) + 1
            if held >= size:
                yield b"".join(piece)
                piece, held = [], 0
        piece.append(b'],"usage":' + json_encode(_usage(prompt_tokens)))
        modelled = batch_modelled(outcomes)
        if modelled:
            piece.append(b',"inference_lab":' + json_encode(modelled))
        piece.append(b"}")
        yield b"".join(piece)

    def _scored(self, outcomes: list[Outcome], prompt_tokens: int) -> bytes:
        job = self.job
        scores = self._scores()
        if job.kind == "rerank":
            return self._rerank(scores, outcomes)
        if not job.cross:  # a pair's tokens: its query's and its document's
            prompt_tokens = sum(len(job.prompts[i]) + len(job.prompts[j]) for i, j in job.pairs)
        data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)]
        out = {"id": self.id, "object": "list", "created": self.created, "model": job.model,
               "data": data, "usage": _usage(prompt_tokens)}
        modelled = batch_modelled(outcomes)
        if modelled:
            out["inference_lab"] = modelled
        return json_encode(out)

    # ---- the numbers ---------------------------------------------------------------------
    def _vectors(self) -> Iterator[dict]:
        """Each input's item of `data`, made when the response's writer reaches it."""
        job, pooling = self.job, self.job.info.pooling
        obj = "embedding" if job.kind == "embed" else "pooling"
        key = "embedding" if job.kind == "embed" else "data"
        for i, ids in enumerate(job.prompts):
            if pooling.task == "embed":
                normalize = pooling.normalize if job.normalize is None else job.normalize
                vector = embedding(job.model, pooling.dimensions, ids, job.dimensions, normalize)
                value = encode(vector, job.encoding_format, job.embed_dtype, job.endianness)
            else:  # a cross-encoder's one output for the text alone (as a pair with itself)
                text = ",".join(map(str, ids))
                logit = cross_logit(job.model, text, text)
                value = [sigmoid(logit) if job.activation else logit]
            yield {"index": i, "object": obj, key: value}

    def _scores(self) -> list[float]:
        job = self.job
        if job.cross:  # one engine request per pair: its query, separator, document
            logits = cross_logits(job.model, job.strings, job.pairs)
            return [sigmoid(x) for x in logits] if job.activation else logits
        dims = job.info.pooling.dimensions
        vectors = [embedding(job.model, dims, ids) for ids in job.prompts]
        return [cosine(vectors[i], vectors[j]) for i, j in job.pairs]

    def _rerank(self, scores: list[float], outcomes: list[Outcome]) -> bytes:
        job = self.job
        tokens = (sum(o.prompt_tokens for o in outcomes) if job.cross else
                  sum(len(job.prompts[i]) + len(job.prompts[j]) for i, j in job.pairs))
        results = [{"index": i, "document": {"text": text}, "relevance_score": s}
                   for i, (text, s) in enumerate(zip(job.documents, scores))]
        results.sort(key=lambda r: r["relevance_score"], reverse=True)
        if 0 < job.top_n < len(results):
            results = results[:job.top_n]
        out = {"id": self.id, "model": job.model,
               "usage": {"prompt_tokens": tokens, "total_tokens": tokens}, "results": results}
        modelled = batch_modelled(outcomes)
        if modelled:
            out["inference_lab"] = modelled
        return json_encode(out)


def _usage(prompt_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens,
            "completion_tokens": 0, "prompt_tokens_details": None}
