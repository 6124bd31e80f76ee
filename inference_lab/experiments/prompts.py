"""What each request of a scenario sends: its prompt text, its length in tokens and the
model (the base model or a LoRA adapter), built from the load's workload keys exactly as
the offline simulator (the oracle) builds its prompts, so that the server's prefix cache
and the oracle's see the same structure.

- Structured loads (`shared_prefix_len`, `num_turns`): the token IDs come from
  inference_lab.common.conversations (shared system prompts; each turn resends the
  conversation so far, its reply included, plus a new message), keyed by closed-loop user
  or by open-loop conversation number (arrival // num_turns), as the offline driver keys
  them. Each token becomes 4 ASCII characters (3 of its bytes in base64), which the
  server's built-in byte-level tokenizer reads back as exactly one token: equal token
  runs give equal text, and two distinct (random 32-bit) IDs give the same text only
  with probability 2^-24 (a 64-token block never), so prefixes are shared exactly where
  the oracle's are. (A server given a real `--tokenizer` cuts the text differently.)
- Unstructured loads: `prompt_tokens` filler tokens whose first token is unique per
  request, so no two requests share a cached block (the oracle sends no token IDs and
  models no hits).
- Traces (`of_ids`): a Mooncake trace's prompt is its hash ids' blocks (common.traces), as
  text like a structured load's; a trace without hash ids is unstructured.
- `lora_adapters`: each request goes to an adapter with its fraction's probability
  (common.workload.draw_adapter, one draw per request), the rest to the base model.

Knows the workload keys and the text form of a token. Does not know HTTP framing (the
client builds the bytes) or the controllers.
"""

from __future__ import annotations

import base64
import random
from dataclasses import dataclass

from inference_lab.common.conversations import Conversations
from inference_lab.common.workload import WorkloadSpec, draw_adapter

__all__ = ["Prompt", "Prompts", "token_text"]

_ADAPTER_SEED = 0xADA7  # the adapter draws' own stream (separate from the length draws)


def token_text(token_ids: bytes) -> str:
    """Packed little-endian uint32 token IDs as text of 4 ASCII characters per token: the
    first 3 bytes of each ID in base64 (so equal IDs give equal text)."""
    three = bytearray(len(token_ids) // 4 * 3)
    three[0::3] = token_ids[0::4]
    three[1::3] = token_ids[1::4]
    three[2::3] = token_ids[2::4]
    return base64.b64encode(three).decode("ascii")


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str | None  # None: the client's own filler with a unique first token (or, in
    #                   virtual time, no text is made: `ids` is what the lab takes)
    tokens: int  # prompt length in tokens (as the built-in tokenizer counts it)
    adapter: str  # "" = the base model
    ids: bytes = b""  # the token IDs (packed uint32) when the prompt has a structure


class Prompts:
    def __init__(self, spec: WorkloadSpec, text: bool = True) -> None:
        self.text = text  # make the prompts' text (a served lab reads text; a virtual one IDs)
        self.convs = (Conversations(spec.shared_prefix_len, spec.num_shared_prefixes,
                                    spec.num_turns, spec.seed) if spec.structured else None)
        self.num_turns = spec.num_turns
        self.adapters = spec.lora_adapters
        self.pick = random.Random(spec.seed ^ _ADAPTER_SEED)
        self.opened = 0  # open-loop prompts built (arrival i is in conversation i // num_turns)

    @property
    def structured(self) -> bool:
        return self.convs is not None

    def next(self, user: int, input_len: int, output_len: int) -> Prompt:
        """The next prompt of closed-loop `user` (-1: an open-loop arrival)."""
        adapter = (draw_adapter(self.adapters, self.pick) or "") if self.adapters else ""
        if self.convs is None:
            return Prompt(None, input_len, adapter)
        if user < 0:
            key, self.opened = ("open", self.opened // self.num_turns), self.opened + 1
        else:
            key = user
        ids = self.convs.next_prompt(key, input_len, output_len)
        return Prompt(token_text(ids) if self.text else None, len(ids) // 4, adapter, ids)

    def of_ids(self, ids: bytes, input_len: int) -> Prompt:
        """A trace's request: its prompt's token IDs (b"": unstructured, `input_len` filler
        tokens), through an adapter as `next` picks one."""
        adapter = (draw_adapter(self.adapters, self.pick) or "") if self.adapters else ""
        if not ids:
            return Prompt(None, input_len, adapter)
        return Prompt(token_text(ids) if self.text else None, len(ids) // 4, adapter, ids)
