"""A lab process ends with the lab process that started it, however that one ends.

`serve` starts its engine, and `experiment --serve` its `serve`, in sessions of their own
(Ctrl-C reaches only the parent, which stops them in order), so no terminal, `timeout` or
process-group kill reaches them: when the parent dies without stopping them (SIGKILL, a
crash) they would run for good. The parent passes its pid in the environment
(`child_env`); the child, at start (`bind_to_parent`, called by `inference_lab.cli.main`),
asks the kernel for SIGTERM when its parent dies (Linux's PR_SET_PDEATHSIG), then checks
that the parent is still the one recorded, since it may have died before the request.

SIGTERM rather than SIGKILL because an orphan still has cleanup that matters (the engine
removes its `ipc://` KV-event sockets and a temporary state directory nobody else will);
but it has nobody to drain for, so its stop asks `shutdown_grace`, which answers 0 for an
orphan and arms a deadline (SIGALRM, whose default action ends the process) in case that
cleanup hangs. A child that is not a lab command (a `multiprocessing` worker forked by
`calibrate --jobs`) calls `bind_to(parent_pid)` itself; its SIGTERM ends it at once.

Knows: the kernel's death signal, which fires when the *thread* that forked the child
exits, not the process: every lab spawn happens on the main thread, which lives as long
as its process. Elsewhere than Linux, a daemon thread polls `os.getppid()` (a child is
reparented when its parent dies) every `POLL_S` and sends the process SIGTERM.
Does not know which commands there are, nor how each one stops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading

PARENT_PID_ENV = "INFERENCE_LAB_PARENT_PID"
DEATH_SIGNAL = signal.SIGTERM
ORPHAN_DEADLINE_S = 4  # an orphan's cleanup, at most (the promise is: gone within 5 s)
POLL_S = 0.5  # the fallback's polling period
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

_parent: int | None = None  # the pid bound to, once bound


def child_env(env: dict) -> dict:
    """The environment to start a lab child with: `env` plus this process's pid, which
    the child binds its life to (`bind_to_parent`)."""
    return {**env, PARENT_PID_ENV: str(os.getpid())}


def bind_to_parent() -> None:
    """Bind this process's life to the parent recorded by `child_env`, if any (a process
    started by hand, or by something other than the lab, is left alone). The variable is
    taken out of the environment so that it never reaches a grandchild unrecorded."""
    text = os.environ.pop(PARENT_PID_ENV, None)
    if not text:
        return
    try:
        parent = int(text)
    except ValueError:
        raise SystemExit(f"inference-lab: {PARENT_PID_ENV}={text!r} is not a process id")
    bind_to(parent)


def bind_to(parent: int) -> None:
    """SIGTERM to this process when `parent` dies; exits now if it already has."""
    global _parent
    _parent = parent
    if not _set_death_signal():
        threading.Thread(target=_watch_parent, name="lifeline", daemon=True).start()
    # The parent may have died between its fork and the request above; then nothing
    # will send the signal.
    if os.getppid() != parent:
        print(f"inference-lab: the parent process {parent} is gone; exiting", file=sys.stderr,
              flush=True)
        os._exit(1)


def orphaned() -> bool:
    """The parent this process is bound to has died (False when not bound)."""
    return _parent is not None and os.getppid() != _parent


def shutdown_grace(grace: float) -> float:
    """The grace a stopping process gives its in-flight work: `grace`, or 0 for an orphan
    (nobody is left to receive the work), which also gets ORPHAN_DEADLINE_S to finish
    its cleanup before SIGALRM ends it."""
    if not orphaned():
        return grace
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(ORPHAN_DEADLINE_S)
    return 0.0


def _set_death_signal() -> bool:
    """PR_SET_PDEATHSIG through libc; False where there is none (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(DEATH_SIGNAL), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    return True


def _watch_parent() -> None:
    tick = threading.Event()  # never set: a sleep that needs no clock
    while not tick.wait(POLL_S):
        if orphaned():
            os.kill(os.getpid(), DEATH_SIGNAL)
            return
