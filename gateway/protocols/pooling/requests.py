"""The request bodies of vLLM's pooling routes, and what is checked once the model is known.

Knows: the bodies of /v1/embeddings (OpenAI's, with vLLM's additions), /pooling, /score
(`text_1` / `text_2`, `queries` / `documents`, `queries` / `items`, `data_1` / `data_2`)
and /rerank (Jina's and Cohere's: `query`, `documents`, `top_n`) as msgspec schemas
(unknown fields are ignored, as vLLM's pydantic models ignore them); their inputs as token
IDs under the lab's tokenizer; and, against the model the request names (the engine's
ModelInfo), vLLM's rules: which kind of model serves which route (its 400 "The model does
not support ... API"), `truncate_prompt_tokens`, the longest input, `dimensions` (only a
matryoshka model's, and only its listed ones when it lists them), a pair's tokens for a
cross-encoder and each text alone for an embedding model. The outcome is a `Job`: the
engine requests to run (each a pooling request: its prefill, nothing generated) and what
the reply needs to answer them.

Does not know: response shapes (gateway.protocols.pooling.replies), aiohttp, gRPC.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Literal

import msgspec

from inference_lab.common.tokenizer import JoinedIds, Tokenizer
from inference_lab.gateway.protocols.base import (
    _U31, checked_ids, decode, invalid, text_ids,
)
from inference_lab.gateway.protocols.openai.schemas import ChatMessage, chat_prompt
from inference_lab.gateway.protocols.pooling.vectors import EMBED_DTYPES, ENDIANNESS

MAX_INPUTS = 2048  # inputs of one embeddings request (OpenAI's own bound)
MAX_DOCUMENTS = 1024  # texts on either side of one score or rerank request
SEPARATOR = 0xFFFFFF01  # between a pair's query and document (a cross-encoder's [SEP])
_SEPARATOR = array("I", (SEPARATOR,))

Priority = Annotated[int, msgspec.Meta(ge=-(2**31), le=_U31)]
Truncate = Annotated[int, msgspec.Meta(ge=-1)]
Inputs = str | list[str | int | list[int]]


class _Pooling(msgspec.Struct, kw_only=True):
    model: str
    user: str | None = None
    truncate_prompt_tokens: Truncate | None = None
    priority: Priority = 0
    request_id: str | None = None
    add_special_tokens: bool | None = None  # accepted: the lab's tokenizers add none


class _Encoded(_Pooling, kw_only=True):
    encoding_format: Literal["float", "base64"] = "float"
    embed_dtype: Literal[EMBED_DTYPES] = "float32"  # type: ignore[valid-type]
    endianness: Literal[ENDIANNESS] = "native"  # type: ignore[valid-type]
    dimensions: int | None = None
    normalize: bool | None = None
    input: Inputs | None = None
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)] | None = None


class EmbeddingsRequest(_Encoded, kw_only=True):
    pass


class PoolingRequest(_Encoded, kw_only=True):
    task: str | None = None
    use_activation: bool | None = None
    activation: bool | None = None  # (deprecated names of use_activation)
    softmax: bool | None = None


class _Scored(_Pooling, kw_only=True):
    use_activation: bool | None = None
    activation: bool | None = None
    softmax: bool | None = None
    mm_processor_kwargs: dict | None = None


class ScoreRequest(_Scored, kw_only=True):
    text_1: str | list[str] | None = None
    text_2: str | list[str] | None = None
    queries: str | list[str] | None = None
    documents: str | list[str] | None = None
    items: str | list[str] | None = None
    data_1: str | list[str] | None = None
    data_2: str | list[str] | None = None


class RerankRequest(_Scored, kw_only=True):
    query: str
    documents: list[str]
    top_n: Annotated[int, msgspec.Meta(ge=0)] = 0
    return_documents: bool | None = None  # (Cohere's: accepted; vLLM always returns them)
    max_tokens_per_doc: int | None = None  # (Cohere's: accepted, not applied, as vLLM)


_decoders = {cls: msgspec.json.Decoder(cls)
             for cls in (EmbeddingsRequest, PoolingRequest, ScoreRequest, RerankRequest)}


def decode_pooling(cls: type, body: bytes):
    """Parse and validate a pooling route's body; GatewayError(invalid_request) names the field."""
    return decode(_decoders[cls], body)


@dataclass(slots=True)
class Job:
    """A pooling request as parsed (`kind` "embed", "pool", "score" or "rerank"), with its
    texts as token IDs; `prompts` are the engine requests to run, set by `prepare` once
    the model is known (a pair each for a cross-encoder, each text alone for an
    embedding model)."""

    kind: str
    model: str
    texts: list[Sequence[int]]  # embed / pool: the inputs; score / rerank: side 1 then side 2
    where: str  # the field the inputs come from ("$.input[{}]")
    strings: list[str] = field(default_factory=list)  # score / rerank: `texts` as given
    n_first: int = 0  # score / rerank: how many of `texts` are side 1 (queries)
    documents: list[str] = field(default_factory=list)  # rerank: as given, for the results
    top_n: int = 0
    encoding_format: str = "float"
    embed_dtype: str = "float32"
    endianness: str = "native"
    dimensions: int | None = None
    normalize: bool | None = None
    activation: bool = True
    truncate: int | None = None
    task: str | None = None  # /pooling's `task`
    prompts: list[Sequence[int]] = field(default_factory=list)
    pairs: list[tuple[int, int]] = field(default_factory=list)  # score: (text i, text j) each
    info: object = None  # the model's ModelInfo, once checked
    cross: bool = False  # score / rerank on a cross-encoder: a pair per engine request


def _activation(req) -> bool:
    for value in (req.use_activation, req.activation, req.softmax):
        if value is not None:
            return value
    return True


def _texts(value: Inputs, tokenizer: Tokenizer, where: str) -> list[Sequence[int]]:
    """An `input`: a string or token IDs is one input; a list of strings or of token-ID
    lists is several (at most MAX_INPUTS)."""
    if isinstance(value, str):
        return [text_ids(tokenizer, value)]
    if not value:
        raise invalid(f"Input must not be empty - at `{where}`")
    kinds = {type(item) for item in value}
    if kinds == {int}:
        return [checked_ids(value, where)]  # type: ignore[arg-type]
    if kinds != {str} and kinds != {list}:
        raise invalid("Mixed inputs: `input` is a string, a list of token ids, a list of "
                      f"strings or a list of lists of token ids - at `{where}`")
    if len(value) > MAX_INPUTS:
        raise invalid(f"Too many inputs: at most {MAX_INPUTS} in one request, got "
                      f"{len(value)} - at `{where}`")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            out.append(text_ids(tokenizer, item))
        elif not item:
            raise invalid(f"An input of token ids must not be empty - at `{where}[{i}]`")
        else:
            out.append(checked_ids(item, f"{where}[{i}]"))
    return out


def _encoded_job(kind: str, req: _Encoded, tokenizer: Tokenizer) -> Job:
    if (req.input is None) == (req.messages is None):
        raise invalid("Exactly one of `input` and `messages` is required - at `$.input`")
    if req.input is not None:
        texts = _texts(req.input, tokenizer, "$.input")
        where = "$.input[{}]" if not isinstance(req.input, str) and len(texts) > 1 else "$.input"
    else:
        texts, where = [chat_prompt(tokenizer, req.messages)], "$.messages"
    return Job(kind, req.model, texts, where, encoding_format=req.encoding_format,
               embed_dtype=req.embed_dtype, endianness=req.endianness,
               dimensions=req.dimensions, normalize=req.normalize,
               truncate=req.truncate_prompt_tokens,
               task=getattr(req, "task", None),
               activation=_activation(req) if isinstance(req, PoolingRequest) else True)


def embeddings_job(body: bytes, tokenizer: Tokenizer) -> tuple[Job, int]:
    req = decode_pooling(EmbeddingsRequest, body)
    return _encoded_job("embed", req, tokenizer), req.priority


def pooling_job(body: bytes, tokenizer: Tokenizer) -> tuple[Job, int]:
    req = decode_pooling(PoolingRequest, body)
    return _encoded_job("pool", req, tokenizer), req.priority


def _side(value: str | list[str], where: str) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if len(texts) > MAX_DOCUMENTS:
        raise invalid(f"Too many texts: at most {MAX_DOCUMENTS} in one request, got "
                      f"{len(texts)} - at `{where}`")
    return texts


_SCORE_PAIRS = (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"),
                ("data_1", "data_2"))


def score_job(body: bytes, tokenizer: Tokenizer) -> tuple[Job, int]:
    req = decode_pooling(ScoreRequest, body)
    if req.mm_processor_kwargs:
        raise invalid("Multimodal scoring is not supported by this model - at `$.mm_processor_kwargs`")
    given = [(a, b) for a, b in _SCORE_PAIRS
             if getattr(req, a) is not None and getattr(req, b) is not None]
    if not given:
        raise invalid("Expected one pair of fields: text_1 and text_2, queries and documents, "
                      "queries and items, or data_1 and data_2 - at `$`")
    first_name, second_name = given[0]
    first = _side(getattr(req, first_name), f"$.{first_name}")
    second = _side(getattr(req, second_name), f"$.{second_name}")
    _check_lens(len(first), len(second))
    strings = [*first, *second]
    job = Job("score", req.model, [text_ids(tokenizer, t) for t in strings],
              f"$.{second_name}[{{}}]", strings=strings, n_first=len(first),
              activation=_activation(req), truncate=req.truncate_prompt_tokens)
    return job, req.priority


def rerank_job(body: bytes, tokenizer: Tokenizer) -> tuple[Job, int]:
    req = decode_pooling(RerankRequest, body)
    if req.mm_processor_kwargs:
        raise invalid("Multimodal scoring is not supported by this model - at `$.mm_processor_kwargs`")
    documents = _side(req.documents, "$.documents")
    _check_lens(1, len(documents))
    strings = [req.query, *documents]
    job = Job("rerank", req.model, [text_ids(tokenizer, t) for t in strings],
              "$.documents[{}]", strings=strings, n_first=1, documents=list(req.documents),
              top_n=req.top_n, activation=_activation(req), truncate=req.truncate_prompt_tokens)
    return job, req.priority


def _check_lens(n_first: int, n_second: int) -> None:
    """vLLM's rule for the two sides of a score: 1:1, 1:N or N:N."""
    if n_first == 0:
        raise invalid("At least one text element must be given")
    if n_second == 0:
        raise invalid("At least one text_pair element must be given")
    if n_first > 1 and n_first != n_second:
        raise invalid("Input lengths must be either 1:1, 1:N or N:N")


# ---- against the model -------------------------------------------------------------------

API = {"embed": "Embeddings", "pool": "Pooling", "score": "Score", "rerank": "Rerank"}
_WHAT = {"embed": "embedding generation", "pool": "pooling", "score": "scoring",
         "rerank": "reranking"}


def prepare(job: Job, info) -> None:
    """Check `job` against its model (`info`: the engine's ModelInfo) as vLLM does, and set
    the engine requests it runs (`prompts`). Raises the 400s vLLM gives."""
    if not info.HasField("pooling"):
        raise invalid(f"The model does not support {API[job.kind]} API")
    pooling = info.pooling
    embedder = pooling.task == "embed"
    if job.kind == "embed" and not embedder:
        raise invalid(f"The model does not support {API[job.kind]} API")
    if job.kind == "pool" and job.task not in (None, "embed", "classify", "score"):
        raise invalid(f"Unsupported task: {job.task!r}; this server's pooling models serve "
                      "'embed', 'classify' and 'score' - at `$.task`")
    if job.kind == "pool" and job.task is not None and (job.task == "embed") != embedder:
        raise invalid(f"Task {job.task!r} is not supported by model {info.name!r}, which "
                      f"serves {'embed' if embedder else 'classify and score'} - at `$.task`")
    if job.kind in ("embed", "pool"):
        _check_dimensions(job, info)
    job.cross = job.kind in ("score", "rerank") and not embedder
    if job.cross:
        firsts = job.texts[:job.n_first]
        seconds = job.texts[job.n_first:]
        if len(firsts) == 1:
            firsts = firsts * len(seconds)
        # each pair reads its query's IDs where they are (one query is never copied per
        # document: JoinedIds); the engine still receives every pair's IDs, packed one
        # pair at a time as it is sent, so its prompt lengths and prefix cache are the same
        prompts = [JoinedIds(q, _SEPARATOR, d) for q, d in zip(firsts, seconds)]
    else:
        prompts = list(job.texts)
    job.prompts = _truncated(prompts, job, info)
    if job.kind in ("score", "rerank"):
        n = len(job.texts) - job.n_first
        job.pairs = [(0 if job.n_first == 1 else j, job.n_first + j) for j in range(n)]
    job.info = info


def _truncated(prompts: list[Sequence[int]], job: Job, info) -> list[Sequence[int]]:
    """Each prompt kept to its last `truncate_prompt_tokens` tokens (-1: the model's
    length), as vLLM truncates; then none may be longer than the model takes."""
    limit = info.max_request_tokens or info.max_model_len
    truncate = job.truncate
    if truncate is not None:
        if truncate == -1:
            truncate = info.max_model_len
        elif truncate > info.max_model_len:
            raise invalid(f"truncate_prompt_tokens value ({truncate}) is greater than "
                          f"max_model_len ({info.max_model_len}). Please, select a smaller "
                          "truncation size. - at `$.truncate_prompt_tokens`")
        if truncate >= 1:
            prompts = [p[-truncate:] if len(p) > truncate else p for p in prompts]
    for i, prompt in enumerate(prompts):
        if len(prompt) > limit:
            at = job.where.format(i) if "{}" in job.where else job.where
            raise invalid(f"This model's maximum context length is {limit} tokens. However, "
                          f"you requested {len(prompt)} tokens in the input for "
                          f"{_WHAT[job.kind]}. Please reduce the length of the input. - at `{at}`")
    return prompts


def _check_dimensions(job: Job, info) -> None:
    """`dimensions` as vLLM's PoolingParams.verify takes it for an embedding model."""
    if job.dimensions is None:
        return
    pooling = info.pooling
    if pooling.task != "embed":
        raise invalid(f"`dimensions` applies to embedding models; {info.name!r} is a "
                      "cross-encoder - at `$.dimensions`")
    if not pooling.matryoshka:
        raise invalid(f'Model "{info.name}" does not support matryoshka representation, '
                      "changing output dimensions will lead to poor results.")
    listed = list(pooling.matryoshka_dimensions)
    if listed and job.dimensions not in listed:
        raise invalid(f'Model "{info.name}" only supports {listed} matryoshka dimensions, '
                      "use other output dimensions will lead to poor results.")
    if job.dimensions < 1:
        raise invalid("Dimensions must be greater than 0")
    if job.dimensions > pooling.dimensions:
        raise invalid(f"Dimensions ({job.dimensions}) exceed the model's {pooling.dimensions} "
                      "- at `$.dimensions`")
