"""The token IDs of a workload's prompts, when their structure matters: shared system
prompts and multi-turn conversations whose prefix grows turn by turn.

Knows two workload keys (see inference_lab.common.workload): `shared_prefix_len` (every
conversation starts with one of `num_shared_prefixes` fixed prefixes of that many tokens,
picked uniformly) and `num_turns` (a conversation's turn k + 1 sends turn k's prompt, its
reply, and a new message). A prompt is then prefix + history + a new message whose length
is drawn from `input_len_dist`. Token IDs are random 32-bit values from the workload's
seed (a separate stream from the length draws), packed as little-endian uint32, the
engine's form. Does not know the engine or the clock.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(slots=True)
class _Conversation:
    history: bytes  # prefix + earlier turns' prompts and replies
    turns: int = 0  # turns sent so far


class Conversations:
    def __init__(self, shared_prefix_len: int, num_shared_prefixes: int, num_turns: int,
                 seed: int) -> None:
        self.rng = random.Random(seed ^ 0x5EED_C0DE)
        self.prefixes = [self.rng.randbytes(4 * shared_prefix_len)
                         for _ in range(num_shared_prefixes)] if shared_prefix_len else [b""]
        self.num_turns = num_turns
        self.live: dict[object, _Conversation] = {}

    def next_prompt(self, key: object, input_len: int, output_len: int) -> bytes:
        """The next prompt of conversation `key` (a user, or a conversation number): a new
        conversation after `num_turns` turns. Its reply (output_len tokens) joins the
        history now, since the simulation knows its length in advance."""
        rng = self.rng
        conv = self.live.get(key)
        if conv is None or conv.turns >= self.num_turns:
            conv = self.live[key] = _Conversation(rng.choice(self.prefixes))
        prompt = conv.history + rng.randbytes(4 * input_len)
        conv.turns += 1
        if conv.turns < self.num_turns:
            conv.history = prompt + rng.randbytes(4 * output_len)
        else:
            del self.live[key]
        return prompt
