"""Reasoning output: what each API's request says about it, and how a reply's tokens split.

Knows: a request's reasoning share as the engine takes it (`SubmitRequest.reasoning_share`:
None leaves it to the engine, whose `--reasoning` gives a reasoning model its preset's
share; 0 asks for none): OpenAI's `reasoning_effort` (chat) and `reasoning.effort`
(Responses) as fixed shares, Anthropic's `thinking` (enabled: its `budget_tokens` over
`max_tokens`; absent or disabled: none); and `Split`, the count of each sequence's tokens
so far against the reasoning tokens the engine announced on admission
(`Admitted.reasoning_tokens`): which of k new tokens are reasoning, which content.

Does not know: any API's shapes (each dialect renders reasoning its own way:
`reasoning_content` deltas, reasoning items, thinking blocks).
"""

from __future__ import annotations

from inference_lab.gateway.protocols.base import invalid

# OpenAI's efforts as shares of a reply (gpt-oss takes low, medium and high; "minimal"
# and "none" are the newer models')
EFFORT_SHARE = {"none": 0.0, "minimal": 0.1, "low": 0.2, "medium": 0.5, "high": 0.8}


def effort_share(effort: str | None, where: str) -> float | None:
    """The share a `reasoning_effort` asks for (None: not said)."""
    if effort is None:
        return None
    share = EFFORT_SHARE.get(effort)
    if share is None:
        raise invalid(f"Invalid reasoning effort {effort!r}: expected one of "
                      f"{', '.join(EFFORT_SHARE)} - at `{where}`")
    return share


def thinking_share(thinking: dict | None, max_tokens: int) -> float:
    """Anthropic's `thinking`: {"type": "enabled", "budget_tokens": N} thinks up to N of
    the reply's `max_tokens` (N >= 1024 and below max_tokens, as Anthropic requires);
    anything else (absent, "disabled") thinks not."""
    if not thinking or thinking.get("type") != "enabled":
        if thinking and thinking.get("type") not in ("disabled", "adaptive"):
            raise invalid("Invalid thinking: expected type 'enabled' or 'disabled' - at "
                          "`$.thinking.type`")
        return 0.0
    budget = thinking.get("budget_tokens")
    if type(budget) is not int or budget < 1024:
        raise invalid("thinking.budget_tokens: Input should be greater than or equal to 1024 "
                      "- at `$.thinking.budget_tokens`")
    if budget >= max_tokens:
        raise invalid("`max_tokens` must be greater than `thinking.budget_tokens` - at "
                      "`$.max_tokens`")
    return budget / max_tokens


class Split:
    """Each of `n` sequences' tokens so far, of which the first `reasoning` are reasoning."""

    __slots__ = ("reasoning", "sent")

    def __init__(self, reasoning: int, n: int = 1) -> None:
        self.reasoning = reasoning
        self.sent = [0] * n

    def take(self, index: int, k: int) -> tuple[int, int]:
        """(reasoning, content) tokens among sequence `index`'s next k."""
        before = self.sent[index]
        self.sent[index] = before + k
        thinking = min(k, max(0, self.reasoning - before))
        return thinking, k - thinking

    def of(self, count: int) -> int:
        """Reasoning tokens of a sequence of `count` tokens."""
        return min(count, self.reasoning)
