"""The clock a gateway and an engine share for arrival stamps, and how to tell it is shared.

A gateway stamps each request with the instant it finished reading it (`time.monotonic()`)
and the engine books the arrival at that instant, so the lab's own hop (gRPC, event-loop
queueing) is not added on top of the modelled queue + prefill (docs/architecture.md,
"Arrival stamps").

The assumption: on Linux, `time.monotonic()` reads CLOCK_MONOTONIC, one clock for every
process of a machine (seconds since boot, never set), so two processes on one host (one
pod, one compose stack) read the same clock. The guard: the kernel's boot id names that
clock. The gateway sends its boot id once per Session (call metadata `CLOCK_METADATA`);
the engine trusts a Session's stamps only when it is its own boot id, so a gateway on
another host never moves an arrival. Even then the engine clamps every stamp (never in its
future, at most `Pacer.MAX_BACKDATE` wall seconds in its past, never before the step it
last booked), which also covers a time namespace that offsets one container's clock.
Without a boot id (not Linux) no stamps are sent and none is trusted.

Knows: /proc and time.monotonic. Does not know gRPC or the pacer.
"""

from __future__ import annotations

import functools

CLOCK_METADATA = "x-inference-lab-clock"  # gRPC metadata key: the sender's clock_id()
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


@functools.cache
def clock_id() -> str | None:
    """This machine's CLOCK_MONOTONIC, named by the kernel's boot id (None: unknown)."""
    try:
        with open(_BOOT_ID, encoding="ascii") as f:
            value = f.read().strip()
    except OSError:
        return None
    return value or None


def same_clock(metadata) -> bool:
    """True when gRPC call metadata says the caller reads this process's clock."""
    mine = clock_id()
    if mine is None:
        return False
    for key, value in metadata or ():
        if key == CLOCK_METADATA:
            return value == mine
    return False
