"""One-shot alarms on the event loop with microsecond precision: `Alarm` (awaited, for
the pacer) and `Timer` (a callback, for a load generator's send schedule).

asyncio's own timers wake late: the epoll selector rounds every timeout *up* to whole
milliseconds, so a step that ends 0.3 ms from now is delivered up to 1 ms late (about
0.5 ms on average, on every step). On Linux a timerfd armed at the absolute
CLOCK_MONOTONIC instant wakes the loop's selector within tens of microseconds instead.
Elsewhere (or if timerfd cannot be had) it falls back to asyncio.sleep.

Knows: the loop and the monotonic clock. Does not know what is being paced.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import math
import os
import sys
import time

log = logging.getLogger(__name__)

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int,
                                         ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def _watched_timerfd(loop: asyncio.AbstractEventLoop, on_readable) -> int:
    """A non-blocking CLOCK_MONOTONIC timerfd that the loop watches; -1 without one."""
    if _LIBC is None:
        return -1
    fd = _LIBC.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
    if fd < 0:
        return -1
    try:
        loop.add_reader(fd, on_readable)
    except (NotImplementedError, RuntimeError, ValueError):
        os.close(fd)
        return -1
    return fd


class Alarm:
    """`await alarm.sleep_until(t)`: return at loop time t (promptly, not up to 1 ms late).
    One sleeper at a time; close() when done."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.fd = -1
        self._waiter: asyncio.Future[None] | None = None
        self._spec = _Itimerspec()
        self.fd = _watched_timerfd(loop, self._fired)
        if self.fd < 0:
            log.debug("no timerfd: pacing with asyncio timers (up to 1 ms late)")

    @property
    def precise(self) -> bool:
        return self.fd >= 0

    async def sleep_until(self, loop_time: float) -> None:
        delay = loop_time - self.loop.time()
        if delay > 0:  # the loop's clock may not be CLOCK_MONOTONIC
            await self._sleep(time.monotonic() + delay, delay)

    async def sleep_until_monotonic(self, deadline: float) -> None:
        """Return at time.monotonic() == deadline: for callers whose clock is
        time.monotonic() (uvloop's loop.time() counts whole milliseconds)."""
        delay = deadline - time.monotonic()
        if delay > 0:
            await self._sleep(deadline, delay)

    async def _sleep(self, deadline: float, delay: float) -> None:
        if self.fd < 0:
            await asyncio.sleep(delay)
            return
        sec = int(deadline)
        spec = self._spec
        spec.it_value.tv_sec = sec
        spec.it_value.tv_nsec = int((deadline - sec) * 1e9)
        if _LIBC.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            await asyncio.sleep(delay)  # cannot happen with valid arguments; never hang
            return
        waiter = self._waiter = self.loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def wake(self) -> None:
        """End the current sleep now (no-op when nobody sleeps)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fired(self) -> None:
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            return  # re-armed since it became readable
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class Timer:
    """`timer.arm(deadline)`: call `callback()` from the loop at time.monotonic() ==
    deadline, precisely (the timerfd, as in Alarm), as a plain callback: no future, task or
    coroutine step per wake-up, for a caller that wakes a thousand times a second.

    Re-arming from inside the callback is the cheap path: timerfd_settime clears a fired
    timer, so the fd needs no read (one system call per wake-up instead of two). A wake-up
    that finds the timer re-armed for later (re-armed between the kernel's report and
    this callback) is ignored. Without timerfd: loop.call_later (up to 1 ms late).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, callback) -> None:
        self.loop = loop
        self.callback = callback
        self.fd = -1
        self.deadline = math.inf  # armed for; inf when not armed
        self._handle: asyncio.TimerHandle | None = None
        self._spec = _Itimerspec()
        self._value = self._spec.it_value  # a view into _spec: set in place
        self._spec_ref = ctypes.byref(self._spec)
        self.fd = _watched_timerfd(loop, self._fired)

    @property
    def precise(self) -> bool:
        return self.fd >= 0

    def arm(self, deadline: float) -> None:
        """(Re-)arm for time.monotonic() == deadline; a deadline already past fires at the
        loop's next turn."""
        self.deadline = deadline
        if self.fd < 0:
            if self._handle is not None:
                self._handle.cancel()
            self._handle = self.loop.call_later(max(0.0, deadline - time.monotonic()), self._fired)
            return
        self._settime(deadline)

    def disarm(self) -> None:
        self.deadline = math.inf
        if self.fd >= 0:
            self._settime(0.0)  # it_value 0 disarms (and clears a fired timer)
        elif self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _settime(self, deadline: float) -> None:
        sec = int(deadline)
        value = self._value
        value.tv_sec = sec
        value.tv_nsec = int((deadline - sec) * 1e9)
        if _LIBC.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, self._spec_ref, None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    def _fired(self) -> None:
        deadline = self.deadline
        if deadline == math.inf:
            if self.fd >= 0:
                self._settime(0.0)  # a stale report: clear it
            return
        if time.monotonic() < deadline - 1e-6:
            if self.fd < 0:  # loop.call_later may run early by its clock's resolution
                self._handle = self.loop.call_later(deadline - time.monotonic(), self._fired)
            return  # (timerfd: re-armed for later since the kernel reported it; settime cleared it)
        self.deadline = math.inf
        self._handle = None
        self.callback()
        if self.deadline == math.inf and self.fd >= 0:
            self._settime(0.0)  # not re-armed: clear the fired timer (instead of a read)

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self.deadline = math.inf
