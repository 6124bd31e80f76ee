"""A task that is cancelled ends cancelled. On Python 3.11 (the lowest this project
supports) `asyncio.wait_for` returns the inner result instead when the inner awaitable
completes in the same loop iteration as the cancel: a background loop stopped at the end of
an experiment then sleeps on for ever, and so does whoever gathers it. The package waits
with `asyncio.timeout` / `timeout_at`, which count the cancel; this file keeps it so."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ("engine", "gateway", "inference_lab")


def _wait_for_calls(root: Path = ROOT) -> list[str]:
    found = []
    for top in PACKAGE:
        for path in sorted((root / top).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "wait_for" and isinstance(node.func.value, ast.Name)
                        and node.func.value.id == "asyncio"):
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_the_package_never_waits_with_asyncio_wait_for():
    assert _wait_for_calls() == []


def test_the_scan_finds_a_wait_for(tmp_path):
    # the scan itself can fail: a file with the call is reported
    pkg = tmp_path / "gateway"
    pkg.mkdir()
    (pkg / "x.py").write_text("import asyncio\nasync def f(x):\n    await asyncio.wait_for(x, 1)\n")
    assert _wait_for_calls(tmp_path) == ["gateway/x.py:3"]


@pytest.mark.parametrize("settle", [1, 3])
def test_a_timeout_scope_ends_cancelled_when_cancel_and_completion_coincide(settle):
    async def main() -> str:
        loop = asyncio.get_running_loop()
        inner = loop.create_future()

        async def waiter() -> int:
            async with asyncio.timeout(5):
                return await inner

        task = loop.create_task(waiter())
        for _ in range(settle):  # loop turns before the race: the parameter under test
            await asyncio.sleep(0)
        inner.set_result(1)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        return "returned"

    assert asyncio.run(main()) == "cancelled"


def test_an_experiment_stops_its_background_tasks_and_leaves_a_stubborn_one_behind(monkeypatch, caplog):
    from inference_lab.experiments import runner

    monkeypatch.setattr(runner, "STOP_TIMEOUT", 0.2)

    async def main() -> tuple[bool, bool, float]:
        loop = asyncio.get_running_loop()

        async def polite() -> None:
            await asyncio.sleep(3600)  # a task that waits until it is cancelled

        async def stubborn() -> None:
            try:
                await asyncio.sleep(3600)  # waits until cancelled, then refuses to stop
            except asyncio.CancelledError:
                await asyncio.sleep(3600)  # swallowed

        a, b = loop.create_task(polite()), loop.create_task(stubborn())
        await asyncio.sleep(0)  # one loop turn: both start and wait
        t = loop.time()
        await runner._stop([a, b], "background tasks")
        took = loop.time() - t
        stuck = not b.done()
        b.cancel()
        return a.cancelled(), stuck, took

    with caplog.at_level("WARNING", logger=runner.log.name):
        polite_cancelled, stuck, took = asyncio.run(main())
    assert polite_cancelled and stuck and 0.15 <= took < 2.0
    assert "1 background tasks did not stop within 0.2 s of their cancel" in caplog.text
