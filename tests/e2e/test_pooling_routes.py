"""vLLM's pooling routes through the real `serve` (a generative model beside two embedding
models and a cross-encoder), driven by the official `openai` and `anthropic` SDKs and
plain HTTP: embeddings, pooling, score and rerank in vLLM's shapes, deterministic unit
vectors, vLLM's 400s for the wrong kind of model, and the same all-or-none 529."""

from __future__ import annotations

import base64
import json
import shutil
import struct
import urllib.error
import urllib.request
from pathlib import Path

import anthropic
import numpy as np
import openai
import pytest

from inference_lab.testing.launch import serve

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("gpt-oss-20b", "bge-base-en-v1.5", "qwen3-embedding-0.6b", "bge-reranker-v2-m3")
BGE, QWEN, RERANKER = MODELS[1:]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    configs = tmp_path_factory.mktemp("configs")
    for name in MODELS:
        shutil.copy(ROOT / "configs" / f"{name}.toml", configs / f"{name}.toml")
    with serve("--config", str(configs)) as served:
        yield served


@pytest.fixture(scope="module")
def client(lab):
    return openai.OpenAI(base_url=lab.base + "/v1", api_key="unused", max_retries=0)


def post(lab, path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(lab.base + path, json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def tokens(lab, text: str) -> int:
    return post(lab, "/tokenize", {"prompt": text})[1]["count"]


def test_the_sdk_gets_unit_vectors_of_the_models_dimension_the_same_every_time(lab, client):
    texts = ["the cat sat on the mat", "a cat sat on a mat", "stock markets fell sharply"]
    first = client.embeddings.create(model=BGE, input=texts)  # the SDK asks for base64
    again = client.embeddings.create(model=BGE, input=texts, encoding_format="float")
    vectors = [np.array(d.embedding) for d in first.data]
    assert [d.index for d in first.data] == [0, 1, 2] and first.model == BGE
    assert {len(v) for v in vectors} == {768}
    assert all(abs(np.linalg.norm(v) - 1) < 1e-6 for v in vectors)
    assert all(np.allclose(a.embedding, b, atol=1e-7) for a, b in zip(again.data, vectors))
    assert first.usage.prompt_tokens == sum(tokens(lab, t) for t in texts)
    assert first.usage.total_tokens == first.usage.prompt_tokens
    # inputs that share words point the same way more than unrelated ones
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.1


def test_token_id_inputs_and_a_decoder_models_matryoshka_dimensions(lab, client):
    ids = [101, 2023, 2003, 102]
    one = client.embeddings.create(model=QWEN, input=ids, encoding_format="float")
    many = client.embeddings.create(model=QWEN, input=[ids, ids[:2]], encoding_format="float")
    assert len(one.data) == 1 and len(one.data[0].embedding) == 1024
    assert np.allclose(one.data[0].embedding, many.data[0].embedding)
    assert one.usage.prompt_tokens == 4 and many.usage.prompt_tokens == 6
    short = client.embeddings.create(model=QWEN, input=ids, dimensions=64, encoding_format="float")
    v = np.array(short.data[0].embedding)
    assert len(v) == 64 and abs(np.linalg.norm(v) - 1) < 1e-6
    full = np.array(one.data[0].embedding[:64])
    assert np.allclose(v, full / np.linalg.norm(full), atol=1e-6)  # the first 64, renormalized


def test_base64_is_float32_in_the_byte_order_asked(lab):
    body = {"model": QWEN, "input": "hello", "encoding_format": "base64", "dimensions": 8}
    little = post(lab, "/v1/embeddings", body)[1]["data"][0]["embedding"]
    big = post(lab, "/v1/embeddings", {**body, "endianness": "big"})[1]["data"][0]["embedding"]
    floats = post(lab, "/v1/embeddings", {**body, "encoding_format": "float"})[1]["data"][0]["embedding"]
    assert struct.unpack("<8f", base64.b64decode(little)) == pytest.approx(floats, abs=1e-7)
    assert struct.unpack(">8f", base64.b64decode(big)) == pytest.approx(floats, abs=1e-7)
    half = post(lab, "/v1/embeddings", {**body, "embed_dtype": "float16"})[1]["data"][0]["embedding"]
    assert np.frombuffer(base64.b64decode(half), "<f2") == pytest.approx(floats, abs=1e-3)


def test_vllms_400s_for_dimensions_and_lengths(lab, client):
    with pytest.raises(openai.BadRequestError, match="does not support matryoshka representation"):
        client.embeddings.create(model=BGE, input="hello", dimensions=64)
    status, body = post(lab, "/v1/embeddings", {"model": QWEN, "input": "x", "dimensions": 2048})
    assert status == 400 and "exceed the model's 1024" in body["error"]["message"]
    long = "word " * 700  # over bge's 512 tokens under the built-in tokenizer
    status, body = post(lab, "/v1/embeddings", {"model": BGE, "input": ["ok", long]})
    assert status == 400
    assert "maximum context length is 512 tokens" in body["error"]["message"]
    assert body["error"]["message"].endswith("- at `$.input[1]`")
    status, body = post(lab, "/v1/embeddings", {"model": BGE, "input": long, "truncate_prompt_tokens": -1})
    assert status == 200 and body["usage"]["prompt_tokens"] == 512
    status, body = post(lab, "/v1/embeddings", {"model": BGE, "input": "x", "truncate_prompt_tokens": 600})
    assert status == 400 and "greater than max_model_len (512)" in body["error"]["message"]
    for bad in ([], [1, "a"], [[]]):
        status, body = post(lab, "/v1/embeddings", {"model": BGE, "input": bad})
        assert status == 400 and "$.input" in body["error"]["message"], bad


def test_the_wrong_kind_of_model_is_vllms_400_on_every_api(lab, client):
    with pytest.raises(openai.BadRequestError, match="The model does not support Embeddings API"):
        client.embeddings.create(model="gpt-oss-20b", input="hello")
    with pytest.raises(openai.BadRequestError, match="does not support Embeddings API"):
        client.embeddings.create(model=RERANKER, input="hello")
    with pytest.raises(openai.BadRequestError, match="does not support Chat Completions API"):
        client.chat.completions.create(model=BGE, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="does not support Completions API"):
        client.completions.create(model=QWEN, prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="does not support Responses API"):
        client.responses.create(model=BGE, input="hi")
    messages = anthropic.Anthropic(base_url=lab.base, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="does not support Messages API"):
        messages.messages.create(model=RERANKER, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    for path in ("/score", "/rerank"):
        status, body = post(lab, path, {"model": "gpt-oss-20b", "query": "q", "documents": ["d"],
                                        "text_1": "q", "text_2": "d"})
        assert status == 400 and "does not support" in body["error"]["message"]
    status, body = post(lab, "/v1/embeddings", {"model": "nope", "input": "x"})
    assert status == 404 and body["error"]["code"] == "model_not_found"


def test_rerank_orders_documents_by_a_cross_encoders_score(lab):
    docs = ["the weather is nice", "giant pandas eat bamboo in china", "pandas eat bamboo"]
    shapes = [post(lab, path, {"model": RERANKER, "query": "what do pandas eat", "documents": docs,
                               "top_n": 2}) for path in ("/rerank", "/v1/rerank", "/v2/rerank")]
    assert {status for status, _ in shapes} == {200}
    body = shapes[0][1]
    assert body["id"].startswith("rerank-") and body["model"] == RERANKER
    results = body["results"]
    assert len(results) == 2 and all(0 < r["relevance_score"] < 1 for r in results)
    assert results[0]["relevance_score"] >= results[1]["relevance_score"]
    assert {r["index"] for r in results} == {1, 2}  # the two about pandas, not the weather
    assert results[0]["document"]["text"] == docs[results[0]["index"]]
    assert [r["results"] for _, r in shapes[1:]] == [results, results]  # deterministic
    pair = tokens(lab, "what do pandas eat") + 1  # query, separator, document
    assert body["usage"]["prompt_tokens"] == sum(pair + tokens(lab, d) for d in docs)


def test_score_pairs_one_to_many_and_many_to_many(lab):
    status, body = post(lab, "/score", {"model": RERANKER, "text_1": ["a b", "c"],
                                        "text_2": ["a b", "x"]})
    assert status == 200 and [d["index"] for d in body["data"]] == [0, 1]
    assert body["data"][0]["object"] == "score" and body["data"][0]["score"] > body["data"][1]["score"]
    raw = post(lab, "/v1/score", {"model": RERANKER, "queries": "a b", "documents": ["a b"],
                                  "use_activation": False})[1]
    assert raw["data"][0]["score"] == pytest.approx(np.log(body["data"][0]["score"] / (1 - body["data"][0]["score"])))
    status, body = post(lab, "/score", {"model": RERANKER, "text_1": ["a", "b"], "text_2": ["a", "b", "c"]})
    assert (status, body["error"]["message"]) == (400, "Input lengths must be either 1:1, 1:N or N:N")
    # an embedding model scores by the cosine of the two texts' embeddings
    pair = ["what is a panda", "a panda is a bear"]
    score = post(lab, "/score", {"model": BGE, "text_1": pair[0], "text_2": [pair[1]]})[1]
    vectors = post(lab, "/v1/embeddings", {"model": BGE, "input": pair})[1]["data"]
    a, b = (np.array(v["embedding"]) for v in vectors)
    assert score["data"][0]["score"] == pytest.approx(float(a @ b), abs=1e-5)


def test_pooling_gives_each_models_own_output(lab):
    status, body = post(lab, "/pooling", {"model": QWEN, "input": ["a", "b"]})
    assert status == 200 and body["id"].startswith("pool-") and len(body["data"]) == 2
    assert body["data"][0]["object"] == "pooling" and len(body["data"][0]["data"]) == 1024
    status, body = post(lab, "/pooling", {"model": RERANKER, "input": "a"})
    assert status == 200 and len(body["data"][0]["data"]) == 1 and 0 < body["data"][0]["data"][0] < 1
    status, body = post(lab, "/pooling", {"model": RERANKER, "input": "a", "task": "embed"})
    assert status == 400 and "$.task" in body["error"]["message"]


def test_a_pooling_request_queues_and_is_refused_as_any_model_all_or_none(lab):
    lab.capacity({"model": RERANKER, "max_num_seqs": 1, "max_waiting": 4})
    try:
        status, body = post(lab, "/rerank", {"model": RERANKER, "query": "q", "documents": ["d"] * 40})
        assert status == 529 and body["error"]["code"] == "queue_saturated"
        status, body = post(lab, "/rerank", {"model": RERANKER, "query": "q", "documents": ["d"] * 3})
        assert status == 200 and len(body["results"]) == 3  # the refused batch left nothing behind
    finally:
        lab.capacity({"model": RERANKER, "max_num_seqs": 256, "max_waiting": 0})


def test_the_engine_counts_pooling_requests_as_vllm_does(lab, client):
    before = lab.engine_metrics()
    client.embeddings.create(model=BGE, input=["one", "two"])
    after = lab.engine_metrics()

    def value(text: str, series: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(series) and f'model_name="{BGE}"' in line)

    assert value(after, "vllm:generation_tokens_total") == 0  # nothing generated, ever
    done = 'vllm:request_success_total{engine="0",finished_reason="stop"'
    assert value(after, done) - value(before, done) == 2  # one engine request per input
    prompt = value(after, "vllm:prompt_tokens_total") - value(before, "vllm:prompt_tokens_total")
    assert prompt == tokens(lab, "one") + tokens(lab, "two")
    with urllib.request.urlopen(lab.base + "/metrics", timeout=5) as r:
        gateway = r.read().decode()
    assert 'route="/v1/embeddings",status="200"' in gateway


async def test_the_experiment_client_loads_a_pooling_model_with_embeddings(lab):
    from inference_lab.experiments.client import Endpoint

    endpoint = Endpoint(lab.base, BGE, pooling=True)
    conn = await endpoint.connect()
    try:
        for serial in (1, 2):  # one keep-alive connection, distinct prompts
            result = await conn.send(endpoint.request(64, 0, serial))
            assert result.status == 200 and result.error == ""
            assert result.completion_tokens == 0 and result.first == 0  # a body, no stream
            assert set(result.modelled) >= {"queue_time_s", "ttft_s", "e2e_s"}
    finally:
        conn.close()
