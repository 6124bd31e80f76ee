"""The state of one simulated request, and the table from status to finish reason.

A request is described by lengths, plus its prompt's block hashes when it can use the
prefix cache (the simulation never sees text). While it sits
in the scheduler's decode group its counters are kept as offsets from the group's step
counter G (see engine.sim.decode_group), so that advancing 256 decodes is one increment;
outside the engine's core, read a live request's tokens through EngineCore.tokens_at.

Parallel sampling (`n` > 1): the request waits and prefills as one; when its prefill
completes the scheduler spawns n - 1 sibling sequences, and the n members of the `Family`
decode as requests of their own that share the prompt's full KV blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    ready: float = -1.0  # when the scheduler may take it: arrival + per-request overhead
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
    eos: bool = False  # its length stands for an end-of-sequence token (finishes as "stop")
    preempted_at: float = -1.0  # start of the step that last preempted it (its tokens had ended)
    preemptions: int = 0
    block_hashes: list[int] | None = None  # chained hashes of the prompt's full blocks
    token_bytes: bytes | None = None  # the prompt's token IDs, kept only for KV events
    cached_refs: int = 0  # leading block_hashes whose cache entries it references (running)
    cached_tokens: int = 0  # prompt tokens found cached at its first scheduling
    lora: object = None  # the LoraAdapter it runs through (engine.sim.lora), or None
    tag: object = None  # the driver's handle (a stream, a closed-loop user, ...)
    n: int = 1  # sequences to sample from the prompt (spawned when its prefill completes)
    index: int = 0  # which sequence of its family (0: the request that was submitted)
    family: "Family | None" = None  # set when the siblings are spawned
    shared_blocks: int = 0  # the family's prompt blocks this sequence uses (not in `blocks`)
    pending_siblings: int = 0  # admitted, not spawned yet: running places held for them
    reserved_blocks: int = 0  # ... and the blocks held for their copies of the last block
    pooling: bool = False  # a pooling request (embeddings, scores): its prefill, no token kept
    reasoning: int = 0  # of each sequence's max_tokens, the first this many are reasoning
    remote_decode: bool = False  # P/D: once prefilled, its KV is held for a consumer to pull
    external_tokens: int = 0  # P/D: prompt positions pulled from a producer (<= prompt_len - 1 used)
    transfer_s: float = 0.0  # P/D: the pull's time, its wait for the link included (sim s)
    handoff: object = None  # P/D: the producer's Handoff of its KV (engine.sim.kv_transfer)
    kv_digest: bytes = b""  # P/D: its prompt's digest, which a pull of its handoff presents
    offload: object = None  # KV offloading's state of it (engine.sim.offload.OffloadRequest)

    def __post_init__(self) -> None:
        if self.ready < self.arrival:
            self.ready = self.arrival

    @property
    def finished(self) -> bool:
        return self.status >= Status.FINISHED_LENGTH

    @property
    def members(self) -> list["Request"]:
        """Every sequence of this request: its family, or itself alone."""
        return self.family.members if self.family is not None else [self]

    @property
    def all_finished(self) -> bool:
        """This request and every sequence of its family are final."""
        return all(m.finished for m in self.members)


@dataclass(slots=True, eq=False)
class Family:
    """The sequences of one request with n > 1, sampled from one prefill. Its prompt's
    full KV blocks are held once, for as long as a member uses them (`holders`); a member
    that is preempted recomputes its whole context alone and shares nothing after."""

    shared_blocks: int  # full prompt blocks, held once for the family
    holders: int  # members still using them
    members: list[Request] = field(default_factory=list)  # by index
