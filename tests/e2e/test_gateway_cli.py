"""`inference-lab gateway` and `run_gateway`: flags, serving, and the real command."""

from __future__ import annotations

import asyncio
import subprocess

import aiohttp
import pytest

from inference_lab.cli import build_parser
from inference_lab.common.ports import free_port
from inference_lab.engine.sim.lengths import OutputLength
from inference_lab.gateway import create_app
from inference_lab.gateway.run import run_gateway
from inference_lab.gateway.server import RUNNER_KWARGS, start_gateway
from inference_lab.testing.fake_engine import FAKE_MODEL
from inference_lab.testing.launch import command
from inference_lab.testing.poll import until


def test_gateway_subcommand_defaults():
    args = build_parser().parse_args(["gateway"])
    assert (args.engine, args.host, args.port) == (["127.0.0.1:50051"], "127.0.0.1", 8080)
    assert (args.data_parallel, args.api_server_index, args.api_server_count) == (None, 0, 1)
    assert callable(args.func)


def test_gateway_subcommand_flags():
    args = build_parser().parse_args([
        "gateway", "--engine", "engine:9000", "--host", "0.0.0.0", "--port", "9"])
    assert (args.engine, args.host, args.port) == (["engine:9000"], "0.0.0.0", 9)
    args = build_parser().parse_args([  # the ranks of one data-parallel server
        "gateway", "--engine", "a:1,b:2", "--data-parallel", "internal",
        "--data-parallel-start-rank", "4"])
    assert args.engine == ["a:1", "b:2"]
    from inference_lab.cli.cmd_gateway import fleet_kwargs

    assert fleet_kwargs(args) == {"api_server": (0, 1), "owners": [[4], [5]],
                                  "data_parallel": True, "balance": True,
                                  "replica_ports": False}


@pytest.mark.parametrize("command_, flags, expected", [
    ("engine", [], (None, 0, 256)),
    ("serve", ["--seed", "3", "--default-max-tokens", "17", "--workload", "w.toml"],
     ("w.toml", 3, 17)),
])
def test_the_output_length_flags_belong_to_engine_and_serve(command_, flags, expected):
    args = build_parser().parse_args([command_, *flags])
    assert (args.workload, args.seed, args.default_max_tokens) == expected


@pytest.mark.parametrize("argv", [["gateway", "--port", "70000"],
                                  ["engine", "--default-max-tokens", "0"],
                                  ["serve", "--event-loop", "trio"]])
def test_bad_values_are_refused_naming_the_flag(argv, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2
    assert argv[1] in capsys.readouterr().err


def test_a_length_flag_given_to_the_gateway_says_where_it_went():
    run = subprocess.run(command("gateway", "--workload", "w.toml"), capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "--workload is a flag of the engine now" in run.stderr


def test_runner_enables_handler_cancellation():
    assert RUNNER_KWARGS["handler_cancellation"] is True


async def healthy(session: aiohttp.ClientSession, port: int) -> bool:
    try:
        async with session.get(f"http://127.0.0.1:{port}/health") as resp:
            return resp.status == 200
    except aiohttp.ClientConnectionError:
        return False


async def wait_healthy(session: aiohttp.ClientSession, port: int, proc=None) -> None:
    """Poll /health, as an end-to-end test would (a process that exits fails at once)."""
    async def check() -> bool:
        assert proc is None or proc.poll() is None, f"exited with {proc.returncode}"
        return await healthy(session, port)

    await until(check, timeout=20, interval=0.05, what="the gateway healthy")


async def test_start_gateway_on_port_zero_serves_health(fake):
    runner, port = await start_gateway(create_app(fake.target), port=0)
    try:
        async with aiohttp.ClientSession() as session:
            assert await healthy(session, port)
    finally:
        await runner.cleanup()


async def test_run_gateway_serves_until_cancelled(fake):
    fake.lengths = OutputLength(3)
    port = free_port()
    task = asyncio.ensure_future(run_gateway(fake.target, port=port))
    try:
        async with aiohttp.ClientSession() as session:
            await wait_healthy(session, port)
            async with session.post(f"http://127.0.0.1:{port}/v1/completions",
                                    json={"model": FAKE_MODEL, "prompt": "x"}) as resp:
                assert (await resp.json())["usage"]["completion_tokens"] == 3
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
async def test_the_command_serves_a_fake_engine_and_stops_on_sigterm(fake, loop):
    fake.lengths = OutputLength(2)
    port = free_port()
    proc = subprocess.Popen(command("gateway", "--engine", fake.target, "--port", str(port),
                                    "--event-loop", loop),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        async with aiohttp.ClientSession() as session:
            await wait_healthy(session, port, proc)
            async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={
                    "model": FAKE_MODEL, "messages": [{"role": "user", "content": "x"}]}) as resp:
                assert (await resp.json())["usage"]["completion_tokens"] == 2
        proc.terminate()
        assert await asyncio.to_thread(proc.wait, 10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
