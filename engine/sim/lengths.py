"""How many tokens a request generates when it does not say exactly.

Knows the rule (the simulation has no EOS: a request generates exactly its length): an
explicit max_tokens is taken as it is, unless the engine was given a workload, whose
output-length distribution is then drawn from (seeded) and capped by max_tokens; without
max_tokens, a draw or the default, capped to the room the largest request leaves after
the prompt. An explicit value is never capped: the core refuses it when it cannot run.
Does not know files: the sampler comes from the caller (inference_lab.common.workload).
"""

from __future__ import annotations

from collections.abc import Callable

DEFAULT_MAX_TOKENS = 256


class OutputLength:
    def __init__(self, default_max_tokens: int = DEFAULT_MAX_TOKENS,
                 sampler: Callable[[], int] | None = None) -> None:
        if default_max_tokens < 1:
            raise ValueError("default_max_tokens must be at least 1")
        self.default = default_max_tokens
        self._sampler = sampler

    def choose(self, requested: int | None, prompt_len: int, largest: int) -> int:
        """The length of a request asking for `requested` (None: not said) whose model
        takes at most `largest` tokens of prompt + output."""
        if self._sampler is None and requested is not None:
            return requested
        n = self._sampler() if self._sampler is not None else self.default
        if requested is not None:
            return max(1, min(n, requested))
        room = largest - prompt_len
        if largest > 0 and room >= 1:
            n = min(n, room)
        return max(1, n)
