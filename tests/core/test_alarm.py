"""The pacer's alarm: never early, wakes the loop by itself, and falls back without timerfd."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from inference_lab.engine.drivers import alarm as alarm_mod
from inference_lab.engine.drivers.alarm import Alarm, Timer
from inference_lab.testing.poll import until


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
    await asyncio.sleep(0)  # one loop turn: the sleeper starts and waits on the alarm
    alarm.close()
    await asyncio.wait_for(sleeper, 5)
    assert alarm.fd == -1


@pytest.mark.parametrize("precise", [True, False])
async def test_timer_calls_back_at_each_deadline_never_before(monkeypatch, precise):
    """The load generator's schedule: re-armed from its own callback (no fd read), each
    call at or after its deadline, once each; a deadline in the past fires at once."""
    if not precise:
        monkeypatch.setattr(alarm_mod, "_LIBC", None)
    loop = asyncio.get_running_loop()
    calls: list[tuple[float, float]] = []
    done = loop.create_future()
    deadlines = [time.monotonic() + 0.002 + 0.0003 * i for i in range(40)]
    deadlines[10] = deadlines[9]  # two at once: the second is already due when re-armed

    def fired() -> None:
        n = len(calls)
        calls.append((deadlines[n] if n < len(deadlines) else 0.0, time.monotonic()))
        if n + 1 < len(deadlines):
            timer.arm(deadlines[n + 1])
        elif not done.done():
            done.set_result(None)

    timer = Timer(loop, fired)
    assert timer.precise == (precise and sys.platform.startswith("linux"))
    try:
        timer.arm(deadlines[0])
        await asyncio.wait_for(done, 10)
        assert len(calls) == len(deadlines)
        assert all(now >= deadline - 1e-6 for deadline, now in calls)
        # Not re-armed: the fired timer is cleared, the loop does not spin on its fd.
        before = len(calls)
        await asyncio.sleep(0.05)  # the window under test: no call may come in it
        assert len(calls) == before
        timer.arm(time.monotonic() - 1.0)  # in the past: at the loop's next turn
        await until(lambda: len(calls) > before, timeout=5, what="the past deadline's call")
        assert len(calls) == before + 1
    finally:
        timer.close()
    assert timer.fd == -1


async def test_timer_rearmed_for_later_or_disarmed_does_not_call_back_early():
    loop = asyncio.get_running_loop()
    calls: list[float] = []
    timer = Timer(loop, lambda: calls.append(time.monotonic()))
    try:
        timer.arm(time.monotonic() + 0.005)
        timer.arm(time.monotonic() + 0.05)  # moved later before it fired
        await asyncio.sleep(0.02)  # past the first deadline: the window under test
        assert calls == []
        timer.disarm()
        await asyncio.sleep(0.06)  # past the second: a disarmed timer stays silent
        assert calls == []
        deadline = time.monotonic() + 0.01
        timer.arm(deadline)
        await until(lambda: calls, timeout=5, what="the timer's call")
        assert len(calls) == 1 and calls[0] >= deadline - 1e-6
    finally:
        timer.close()
