"""What one pooling request costs the gateway: a rerank of one long query against many
documents is work linear in the request (the query's words and hash prefix found once,
its token IDs held once), while the engine receives every pair's token IDs exactly as
before; a large embeddings response is made piece by piece, the pieces the same bytes as
the whole."""

from __future__ import annotations

import hashlib
import json

import pytest

from inference_lab.common.tokenizer import ByteTokenizer, JoinedIds, ids_to_bytes
from inference_lab.gateway.protocols.base import Outcome, json_encode
from inference_lab.gateway.protocols.pooling import EMBEDDINGS, RERANK, SCORE
from inference_lab.gateway.protocols.pooling import vectors
from inference_lab.gateway.protocols.pooling.replies import CHUNK_BYTES
from inference_lab.gateway.protocols.pooling.requests import SEPARATOR
from inference_lab.v1 import engine_pb2 as pb

RERANKER = pb.ModelInfo(name="bge-reranker-v2-m3", max_model_len=8192, max_request_tokens=8192,
                        pooling=pb.PoolingInfo(task="score", dimensions=1))
EMBEDDER = pb.ModelInfo(name="qwen3-embedding-0.6b", max_model_len=32768,
                        max_request_tokens=32768,
                        pooling=pb.PoolingInfo(task="embed", dimensions=1024, normalize=True))


def checked(dialect, body: dict, info):
    batch = dialect.parse(json.dumps(body).encode(), ByteTokenizer())
    dialect.check(batch, info)
    return batch


def pair_logit(model: str, query: str, document: str) -> float:
    """A cross-encoder's logit as the lab defines it (vectors' docstring), computed whole."""
    q = vectors.words(query)
    share = len(q & vectors.words(document)) / len(q) if q else 0.0
    digest = hashlib.sha256("\0".join((model, query, document)).encode()).digest()
    jitter = int.from_bytes(digest[:8], "little") / 2**64 - 0.5
    return 8.0 * share - 4.0 + jitter


def test_a_rerank_reads_its_query_once_however_many_documents(monkeypatch):
    # 1 query of 6,000 words and 1,024 documents: 1,025 texts, so 1,025 calls of words()
    # (not 2 per pair), and one copy of the query's token IDs shared by every pair
    calls = []
    real = vectors.words
    monkeypatch.setattr(vectors, "words", lambda text: calls.append(len(text)) or real(text))
    query, documents = "word " * 6000, [f"a b {i}" for i in range(1024)]
    batch = checked(RERANK, {"model": "bge-reranker-v2-m3", "query": query,
                             "documents": documents}, RERANKER)
    assert all(isinstance(p, JoinedIds) for p in batch.prompts)
    assert len({id(p.parts[0]) for p in batch.prompts}) == 1  # the query's IDs, held once
    batch.reply._scores()
    assert len(calls) == 1 + 1024 and sum(calls) == len(query) + sum(map(len, documents))


def test_the_engine_receives_every_pairs_token_ids_as_before():
    # each pair: the query's IDs, the separator, the document's; lengths and bytes the same
    tokenizer = ByteTokenizer()
    query, documents = "what is the capital of france", ["paris is", "berlin", "x" * 41]
    batch = checked(RERANK, {"model": "bge-reranker-v2-m3", "query": query,
                             "documents": documents}, RERANKER)
    q = list(tokenizer.encode(query))
    for prompt, doc in zip(batch.prompts, documents):
        whole = [*q, SEPARATOR, *tokenizer.encode(doc)]
        assert len(prompt) == len(whole) and list(prompt) == whole
        assert ids_to_bytes(prompt) == ids_to_bytes(whole)


def test_truncation_keeps_a_pairs_last_tokens_as_a_list_would():
    query, documents = "a" * 40, ["b" * 20, "c" * 400]  # 10 + 1 + 5 and 10 + 1 + 100 tokens
    batch = checked(RERANK, {"model": "bge-reranker-v2-m3", "query": query, "documents": documents,
                             "truncate_prompt_tokens": 12}, RERANKER)
    tokenizer = ByteTokenizer()
    for prompt, doc in zip(batch.prompts, documents):
        whole = [*tokenizer.encode(query), SEPARATOR, *tokenizer.encode(doc)]
        assert list(prompt) == whole[-12:] and ids_to_bytes(prompt) == ids_to_bytes(whole[-12:])


@pytest.mark.parametrize("dialect, body", [
    (RERANK, {"query": "the cat sat", "documents": ["a cat", "the dog sat", "", "cat sat the"]}),
    (SCORE, {"text_1": ["the cat", "a dog"], "text_2": ["cat", "dog dog"]}),
])
def test_scores_are_each_pairs_logit_computed_whole(dialect, body):
    batch = checked(dialect, {"model": "bge-reranker-v2-m3", "activation": False, **body},
                    RERANKER)
    job = batch.job
    expected = [pair_logit(job.model, job.strings[i], job.strings[j]) for i, j in job.pairs]
    assert batch.reply._scores() == expected


def outcomes(batch) -> list[Outcome]:
    return [Outcome(len(p), [0], {"queue_s": 0.001, "ttft_s": 0.002, "e2e_s": 0.002})
            for p in batch.prompts]


def test_a_large_embeddings_response_is_made_in_bounded_pieces_of_the_same_bytes():
    batch = checked(EMBEDDINGS, {"model": "qwen3-embedding-0.6b", "input": ["a"] * 2048},
                    EMBEDDER)
    done = outcomes(batch)
    pieces = list(batch.reply.chunks(done))
    item = len(json_encode({"index": 2047, "object": "embedding",
                            "embedding": [0.0] * 1024}))  # (a float's text: up to ~24 bytes)
    assert len(pieces) > 100 and max(map(len, pieces)) < CHUNK_BYTES + 30 * item
    body = json.loads(b"".join(pieces))
    assert [d["index"] for d in body["data"]] == list(range(2048))
    assert body["usage"]["prompt_tokens"] == 2048 and "inference_lab" in body
    assert b"".join(pieces) == batch.reply.body(done)
    # the pieces are the bytes of the response built whole, as a dict
    whole = {"id": batch.reply.id, "object": "list", "created": batch.reply.created,
             "model": "qwen3-embedding-0.6b", "data": body["data"], "usage": body["usage"],
             "inference_lab": body["inference_lab"]}
    assert json.loads(json_encode(whole)) == body


def test_a_small_embeddings_response_is_one_piece():
    batch = checked(EMBEDDINGS, {"model": "qwen3-embedding-0.6b", "input": ["a", "b"],
                                 "encoding_format": "base64"}, EMBEDDER)
    assert len(list(batch.reply.chunks(outcomes(batch)))) == 1
