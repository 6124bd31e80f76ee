"""The pacer's alarm: never early, wakes the loop by itself, and falls back without timerfd."""

from __future__ import annotations

import asyncio
import sys

import pytest

from inference_lab.engine.drivers import alarm as alarm_mod
from inference_lab.engine.drivers.alarm import Alarm


@pytest.mark.parametrize("precise", [True, False])
async def test_sleep_until_never_returns_before_the_deadline(monkeypatch, precise):
    if not precise:
        monkeypatch.setattr(alarm_mod, "_LIBC", None)
    loop = asyncio.get_running_loop()
    alarm = Alarm(loop)
    assert alarm.precise == (precise and sys.platform.startswith("linux"))
    try:
        late = []
        for i in range(50):
            deadline = loop.time() + 0.0002 + 0.00002 * i
            await alarm.sleep_until(deadline)
            now = loop.time()
            assert now >= deadline - 1e-6  # asyncio may fire within its clock resolution
            late.append(now - deadline)
        await alarm.sleep_until(loop.time() - 1.0)  # in the past: returns at once
        assert max(late) < 0.5  # a loose bound: CI machines are noisy; benchmarks measure it
    finally:
        alarm.close()


async def test_close_releases_a_sleeper_and_the_descriptor():
    loop = asyncio.get_running_loop()
    alarm = Alarm(loop)
    sleeper = asyncio.ensure_future(alarm.sleep_until(loop.time() + 3600))
    await asyncio.sleep(0)
    alarm.close()
    await asyncio.wait_for(sleeper, 5)
    assert alarm.fd == -1
