"""What the served KV offloading tests share: a model with a small GPU cache (120 blocks of
64 positions), so three 3,000-token prompts push a fourth out to the host tier, and those
prompts."""

from __future__ import annotations

MODEL = "gpt-oss-20b"
BLOCK = 64
BYTES_PER_TOKEN = 24576  # gpt-oss-20b's KV bytes per position on one GPU (bf16)
CONFIG = f"""model = "{MODEL}"
[scheduler]
block_size = {BLOCK}
kv_cache_capacity = {BYTES_PER_TOKEN * BLOCK * 120}
[hardware.b200]
"""


def text(seed: int, n: int = 3000) -> str:
    """A prompt of its own of about n tokens (the built-in tokenizer packs 4 bytes a token)."""
    return "".join(chr(0x61 + (seed * 7 + i * 13 + i // 5) % 26) for i in range(4 * n))


def cached(usage) -> int:
    """An OpenAI usage's cached prompt tokens."""
    return usage.prompt_tokens_details.cached_tokens
