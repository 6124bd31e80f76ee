"""What a pooling model returns, made up deterministically: embedding vectors and scores.

Knows: an input's vector is a function of the model and the input's token IDs alone (so
a client can cache and compare them): a bag of its tokens and of its pairs of neighbouring
tokens, each hashed to one of BUCKETS rows of a fixed random matrix per model (seeded by
the model's name), summed; inputs that share tokens point the same way, so a query is
nearer to a text that shares its words than to one that does not. Then, as vLLM's
embedding pooler does: the first `dimensions` values (matryoshka), unit length when
normalized. A cross-encoder's score of (query, document) grows with the share of the
query's words the document holds, plus a small hashed jitter, through a sigmoid: in
(0, 1), the logit itself without the activation. The encodings vLLM answers with:
floats, or base64 of float32, float16 or bfloat16 in either byte order.

Does not know: requests, routes or the engine (gateway.protocols.pooling.requests).
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

BUCKETS = 256  # rows of a model's matrix: hashed tokens and token pairs (few: the sum is
# the request's main cost, a BUCKETS x dimensions product)
_GOLDEN = np.uint64(0x9E3779B1)  # Knuth's multiplicative hash (32 bits)
_PAIR = np.uint64(0x85EBCA77)
_MASK = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32 - 8)  # the top 8 bits of the 32-bit hash: one of 256 buckets
assert BUCKETS == 1 << 8
PAIR_WEIGHT = np.float32(0.5)  # a pair of neighbours weighs half a token


def _seed(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("\0".join(parts).encode()).digest()[:8], "little")


@lru_cache(maxsize=16)
def _matrix(model: str, dimensions: int) -> np.ndarray:
    """The model's fixed random matrix, BUCKETS x dimensions (float32; 1 MB at 1,024)."""
    rng = np.random.default_rng(_seed("inference-lab embeddings", model))
    return rng.standard_normal((BUCKETS, dimensions), dtype=np.float32)


def _buckets(ids: np.ndarray) -> np.ndarray:
    """Each id's bucket, as the signed index type bincount takes on every numpy release."""
    return (((ids * _GOLDEN) & _MASK) >> _SHIFT).astype(np.intp)


def embedding(model: str, dimensions: int, ids: Sequence[int], size: int | None = None,
              normalize: bool = True) -> np.ndarray:
    """The vector (float32) of an input of token `ids` under `model`, whose vectors have
    `dimensions` values: the first `size` of them (all: None), of unit length when
    `normalize`."""
    tokens = np.asarray(ids, dtype=np.uint64)
    counts = np.bincount(_buckets(tokens), minlength=BUCKETS).astype(np.float32)
    if len(tokens) > 1:
        pairs = _buckets((tokens[:-1] * _PAIR + tokens[1:]) & _MASK)
        counts += PAIR_WEIGHT * np.bincount(pairs, minlength=BUCKETS).astype(np.float32)
    # (einsum, not `@`: a BLAS call of this size spends more on its threads than on the sum)
    vector = np.einsum("i,ij->j", counts, _matrix(model, dimensions)) / np.float32(math.sqrt(BUCKETS))
    if size is not None:
        vector = vector[:size]
    if normalize:
        norm = float(np.linalg.norm(vector))
        if norm > 0:
            vector = vector / np.float32(norm)
    return vector


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """The cosine similarity of two vectors (vLLM's score for an embedding model)."""
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return float(np.dot(a, b)) / (na * nb) if na and nb else 0.0


def words(text: str) -> frozenset[str]:
    """A text's distinct words, lower-cased (what a cross-encoder's score compares)."""
    return frozenset(_WORD.findall(text.lower()))


_WORD = re.compile(r"\w+")


def cross_logit(model: str, query: str, document: str) -> float:
    """A cross-encoder's logit for (query, document): 8 x the share of the query's distinct
    words found in the document, less 4, plus a jitter in [-0.5, 0.5) from their hash."""
    return cross_logits(model, [query, document], [(0, 1)])[0]


def cross_logits(model: str, texts: Sequence[str], pairs: Sequence[tuple[int, int]]) -> list[float]:
    """`cross_logit(model, texts[i], texts[j])` of each pair (i, j), in work linear in the
    texts' and pairs' sizes: each text's words are found once, and a query's part of the
    hash (model, query) is taken once and copied per pair, so one query against N
    documents costs one pass over the query, not N."""
    found: dict[int, frozenset[str]] = {}
    heads: dict[int, object] = {}
    out = []
    for i, j in pairs:
        q = found.get(i)
        if q is None:
            q = found[i] = words(texts[i])
        d = found.get(j)
        if d is None:
            d = found[j] = words(texts[j])
        share = len(q & d) / len(q) if q else 0.0
        head = heads.get(i)
        if head is None:  # sha256 of "model\0query\0document", its prefix hashed once
            head = heads[i] = hashlib.sha256(f"{model}\0{texts[i]}\0".encode())
        digest = head.copy()
        digest.update(texts[j].encode())
        jitter = int.from_bytes(digest.digest()[:8], "little") / 2**64 - 0.5
        out.append(8.0 * share - 4.0 + jitter)
    return out


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= -700 else 0.0


# ---- encodings (vLLM's encoding_format, embed_dtype, endianness) ----------------------

EMBED_DTYPES = ("float32", "float16", "bfloat16")
ENDIANNESS = ("native", "big", "little")


def encode(vector: np.ndarray, encoding_format: str, embed_dtype: str = "float32",
           endianness: str = "native") -> list[float] | str:
    """`vector` as a response carries it: a list of floats, or base64 of its values in
    `embed_dtype` and byte order (the OpenAI SDK decodes base64 as float32, native)."""
    if encoding_format == "float":
        return vector.tolist()
    order = {"native": "=", "big": ">", "little": "<"}[endianness]
    if embed_dtype == "float32":
        raw = vector.astype(order + "f4").tobytes()
    elif embed_dtype == "float16":
        raw = vector.astype(order + "f2").tobytes()
    else:  # bfloat16: the upper half of each float32
        upper = (vector.astype(np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
        raw = upper.astype(order + "u2").tobytes()
    return base64.b64encode(raw).decode("ascii")
