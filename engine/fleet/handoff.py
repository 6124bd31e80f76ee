"""P/D handoffs between the replicas of one engine process, on the wall clock their pacers
follow.

Knows: where a consumer's `do_remote_prefill` params point (the replica of the same
model whose engine id they name: a replica's id is new at every start, so params of a
replica that restarted, slept or drained point nowhere), when the producer may free the
blocks (when the consumer's pull ends, on the wall clock: each pacer keeps its own
modelled clock, both follow time.monotonic), and the abort timeout's timer (a producer
idle for longer than it would otherwise show its held blocks until its next step).

Does not know: messages, HTTP, what a handoff holds (engine.sim.kv_transfer, through the
cores).
"""

from __future__ import annotations

import asyncio
import time

from inference_lab.engine.sim.kv_transfer import Handoff


class Pull:
    """A consumer's claim on a producer's handoff: the producer frees it once released."""

    __slots__ = ("producer", "handoff")

    def __init__(self, producer, handoff: Handoff) -> None:
        self.producer = producer  # its ModelRuntime
        self.handoff = handoff

    @property
    def tokens(self) -> int:
        return self.handoff.tokens

    def release_at(self, wall: float | None = None) -> None:
        """Free the producer's blocks at `wall` (time.monotonic(); None or past: now);
        a pull that never took place (its request refused) frees them at once, uncounted."""
        if wall is None:
            self._free(pulled=False)
            return
        delay = wall - time.monotonic()
        if delay <= 0:
            self._free()
        else:
            asyncio.get_running_loop().call_later(delay, self._free)

    def _free(self, pulled: bool = True) -> None:
        producer = self.producer
        producer.core.free_handoff(self.handoff, pulled)
        producer.pacer.poke()  # blocks came back: a waiting request may fit now
        producer.metrics.touch()


def find(fleet, model: str, engine_id: str, request_id: str, digest: bytes) -> Pull | None:
    """The handoff `engine_id`'s replica of `model` holds under `request_id`, claimed for a
    pull; None when no replica has that id, the handoff is gone, or it holds another prompt
    than the one whose prompt_digest is `digest`."""
    for replica in fleet.replicas.get(model, {}).values():
        runtime = replica.runtime
        if runtime.engine_id == engine_id:
            handoff = runtime.core.take_handoff(request_id, digest, runtime.pacer.sim_now())
            return Pull(runtime, handoff) if handoff is not None else None
    return None


def expire_later(runtime, handoff: Handoff) -> None:
    """Wake the producer when `handoff`'s abort timeout passes, to free it if still held."""
    delay = runtime.pacer.wall_of(handoff.expires) - time.monotonic()

    def expire() -> None:
        if runtime.core.expire_handoffs(runtime.pacer.sim_now()):
            runtime.pacer.poke()
            runtime.metrics.touch()

    asyncio.get_running_loop().call_later(max(delay, 0.0) + 1e-3, expire)
