"""Polling until a condition holds: only for effects that no event announces (another
process's state, a server's side of a cancel). Bounded in time; the value is returned."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 15.0, interval: float = 0.05,
               what: str = "condition") -> T:
    """Call `predicate` until it returns something true (returned), for at most `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(interval)


async def until(predicate: Callable[[], T | Awaitable[T]], timeout: float = 15.0,
                interval: float = 0.01, what: str = "condition") -> T:
    """`wait_until` on an event loop: other tasks run while it waits. `predicate` may be
    a coroutine function (awaited each time)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        await asyncio.sleep(interval)
