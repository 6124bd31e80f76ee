"""The state of one simulated request, and the table from status to finish reason.

A request is described by lengths, plus its prompt's block hashes when it can use the
prefix cache (the simulation never sees text). While it sits
in the scheduler's decode group its counters are kept as offsets from the group's step
counter G (see engine.sim.decode_group), so that advancing 256 decodes is one increment;
outside the engine's core, read a live request's tokens through EngineCore.tokens_at.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class Status(IntEnum):
    """Ordered: everything >= FINISHED_LENGTH is final."""

    WAITING = 0
    RUNNING = 1
    FINISHED_LENGTH = 2
    FINISHED_CANCELLED = 3
    FINISHED_ABORTED = 4


FINISH_REASON: dict[Status, str] = {
    Status.FINISHED_LENGTH: "length",
    Status.FINISHED_CANCELLED: "cancelled",
    Status.FINISHED_ABORTED: "aborted",
}


@dataclass(slots=True, eq=False)
class Request:
    id: int
    prompt_len: int  # >= 1
    max_tokens: int  # >= 1: exactly this many tokens are generated (no EOS)
    arrival: float  # simulated seconds
    priority: int = 0  # lower runs first under policy "priority"
    status: Status = Status.WAITING
    num_computed: int = 0  # positions whose KV exists; <= prompt_len + num_output (outside the group)
    num_output: int = 0  # tokens sampled so far (outside the group; final once finished)
    blocks: int = 0  # KV blocks held (outside the group)
    in_group: bool = False  # True while decoding in the scheduler's decode group
    group_epoch: int = 0  # bumped on every join, to recognise stale heap entries
    comp_off: int = 0  # in group: num_computed = comp_off + G
    out_off: int = 0  # in group: num_output = out_off + G
    first_scheduled: float = -1.0  # start of the first step that computed it
    first_token: float = -1.0  # end of the step that sampled its first token
    finish_time: float = -1.0
    done_gain: int = 1  # finished by length: tokens its final step gave it
    done_mark: int = -1  # finished by length: the decode group's progress mark at its end
    preempted_at: float = -1.0  # start of the step that last preempted it (its tokens had ended)
    preemptions: int = 0
    block_hashes: list[int] | None = None  # chained hashes of the prompt's full blocks
    token_bytes: bytes | None = None  # the prompt's token IDs, kept only for KV events
    cached_refs: int = 0  # leading block_hashes whose cache entries it references (running)
    cached_tokens: int = 0  # prompt tokens found cached at its first scheduling
    tag: object = None  # the driver's handle (a stream, a closed-loop user, ...)

    @property
    def finished(self) -> bool:
        return self.status >= Status.FINISHED_LENGTH
