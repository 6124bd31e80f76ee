"""`inference-lab gateway` and `run_gateway`: flags, serving, and the real command."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time

import aiohttp
import pytest

from inference_lab.gateway.server import RUNNER_KWARGS, run_gateway, start_gateway
from inference_lab.gateway import create_app
from inference_lab.gateway.testing import FAKE_MODEL, FakeEngine
from inference_lab.cli import build_parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_gateway_subcommand_defaults():
    args = build_parser().parse_args(["gateway"])
    assert (args.engine, args.host, args.port) == ("127.0.0.1:50051", "127.0.0.1", 8080)
    assert (args.workload, args.seed, args.default_max_tokens) == (None, 0, 256)
    assert callable(args.func)


def test_gateway_subcommand_flags():
    args = build_parser().parse_args([
        "gateway", "--engine", "engine:9000", "--host", "0.0.0.0", "--port", "9", "--seed", "3",
        "--default-max-tokens", "17", "--workload", "w.toml"])
    assert (args.engine, args.host, args.port, args.seed) == ("engine:9000", "0.0.0.0", 9, 3)
    assert (args.default_max_tokens, args.workload) == (17, "w.toml")


@pytest.mark.parametrize("flag", [["--port", "70000"], ["--default-max-tokens", "0"]])
def test_gateway_subcommand_refuses_bad_values(flag, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["gateway", *flag])
    assert info.value.code == 2
    assert flag[0] in capsys.readouterr().err


def test_runner_enables_handler_cancellation():
    assert RUNNER_KWARGS["handler_cancellation"] is True


async def test_start_gateway_on_port_zero_serves_health():
    fake = FakeEngine()
    await fake.start()
    runner, port = await start_gateway(create_app(fake.target), port=0)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/health") as resp:
                assert resp.status == 200
    finally:
        await runner.cleanup()
        await fake.stop()


async def test_run_gateway_serves_until_cancelled():
    fake = FakeEngine()
    await fake.start()
    port = free_port()
    task = asyncio.ensure_future(run_gateway(fake.target, port=port, default_max_tokens=3))
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):  # wait on /health like an end-to-end test would
                try:
                    async with session.get(f"http://127.0.0.1:{port}/health") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.02)
            async with session.post(f"http://127.0.0.1:{port}/v1/completions",
                                    json={"model": FAKE_MODEL, "prompt": "x"}) as resp:
                assert (await resp.json())["usage"]["completion_tokens"] == 3
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await fake.stop()
    assert task.cancelled()


async def test_the_command_serves_a_fake_engine_and_stops_on_sigterm():
    fake = FakeEngine()
    await fake.start()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "inference_lab", "gateway", "--engine", fake.target,
         "--port", str(port), "--default-max-tokens", "2"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        async with aiohttp.ClientSession() as session:
            while True:
                assert proc.poll() is None, proc.stdout.read().decode()
                assert time.monotonic() < deadline, "gateway did not become healthy"
                try:
                    async with session.get(f"http://127.0.0.1:{port}/health") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.05)
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
        await fake.stop()
