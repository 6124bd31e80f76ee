"""OpenAI chat completions and (text) completions: the request bodies, and their prompts.

Knows: the request bodies of /v1/chat/completions and /v1/completions as msgspec schemas
(precise 400 messages naming the field; unknown OpenAI fields are ignored; sampling
parameters checked as vLLM checks them), their prompts as token IDs under the configured
tokenizer (a conversation's, with its tool calls and tool definitions; a completions
`prompt` as text or token IDs), and several prompts in one completions request (at most
MAX_PROMPTS: a batch; prompts x n at most MAX_SEQUENCES).

Does not know: responses (gateway.protocols.openai.render), aiohttp, gRPC.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

import msgspec

from inference_lab.common.tokenizer import Tokenizer
from inference_lab.gateway.protocols.base import (
    _U31, Fraction, NonNegative, Penalty, checked_ids, content_text, conversation_ids, decode,
    invalid, text_ids, with_tools,
)
from inference_lab.gateway.protocols.reasoning import effort_share


PositiveInt = Annotated[int, msgspec.Meta(ge=1, le=_U31)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0, le=_U31)]
TopLogprobs = Annotated[int, msgspec.Meta(ge=0, le=20)]  # vLLM's default --max-logprobs
Priority = Annotated[int, msgspec.Meta(ge=-(2**31), le=_U31)]
MAX_N = 128  # OpenAI's own bound on `n`
MAX_PROMPTS = 1024  # prompts in one completions request (a batch), as vLLM's default
# Sequences one request may ask for: prompts x n (vLLM bounds each factor alone, so one
# small request could queue 131,072 sequences).
MAX_SEQUENCES = 1024


class StreamOptions(msgspec.Struct):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage (so far) on every chunk too


class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None

    def words(self) -> str:
        return self.text or ""  # images and audio count as 0 tokens


class FunctionCall(msgspec.Struct):
    name: str = ""
    arguments: str = ""


class ToolCall(msgspec.Struct):
    function: FunctionCall | None = None


class ChatMessage(msgspec.Struct):
    role: str
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls: the model wrote them
    function_call: FunctionCall | None = None  # the deprecated single call

    def text(self) -> str:
        calls = [c.function for c in self.tool_calls or () if c.function is not None]
        if self.function_call is not None:
            calls.append(self.function_call)
        return content_text(self.content) + "".join(f.name + f.arguments for f in calls)


TokenCap = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


class KvLoadTier(msgspec.Struct, kw_only=True):
    """One entry of vLLM's kv_transfer_params.kv_load_tiers: a medium the OffloadingConnector
    may load from (`locality` is taken; the lab's tiers are all local)."""

    medium: Literal["CPU", "STORAGE"]
    locality: Literal["LOCAL", "REMOTE"] = "LOCAL"


class KvTransferParams(msgspec.Struct, kw_only=True):
    """vLLM's kv_transfer_params, the keys NixlConnector and the OffloadingConnector read
    (others are ignored, as the connectors ignore them); a wrong type is a 400 naming the
    key."""

    do_remote_decode: bool = False
    do_remote_prefill: bool = False
    remote_engine_id: str | None = None
    remote_block_ids: list[Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]] | None = None
    remote_host: str | None = None
    remote_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] | None = None
    remote_request_id: str | None = None
    tp_size: Annotated[int, msgspec.Meta(ge=1, le=_U31)] | None = None
    # KV offloading: prompt tokens this request may load from / store to the host tier
    # (0: none; absent: no cap)
    max_load_tokens: TokenCap | None = None
    max_offload_tokens: TokenCap | None = None
    # the tiers it may load from ([]: none; absent: every tier)
    kv_load_tiers: list[KvLoadTier] | None = None


class VllmSampling(msgspec.Struct, kw_only=True):
    """The sampling fields vLLM takes alike on every generation route, checked as vLLM
    checks them (a 400 naming the field), otherwise unused."""

    top_k: Annotated[int, msgspec.Meta(ge=-1)] | None = None  # vLLM: -1 (or 0) = off
    min_p: Fraction | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: Annotated[float, msgspec.Meta(gt=0)] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None


class _GenerationRequest(VllmSampling, kw_only=True):
    model: str
    stream: bool | None = False  # null (as OpenAI's API takes it) = false
    stream_options: StreamOptions | None = None
    max_tokens: PositiveInt | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=MAX_N)] | None = 1  # null = 1
    priority: Priority = 0  # vLLM extension: lower runs first under policy "priority"
    # sampling (and VllmSampling's): checked as vLLM checks them, otherwise unused
    temperature: NonNegative | None = None
    top_p: Fraction | None = None
    logit_bias: dict[str, Annotated[float, msgspec.Meta(ge=-100, le=100)]] | None = None
    user: str | None = None
    kv_transfer_params: KvTransferParams | None = None  # vLLM's P/D disaggregation

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """vLLM: with include_usage, `continuous_usage_stats` puts the usage so far on
        every chunk."""
        return self.include_usage and self.stream_options.continuous_usage_stats


class ChatCompletionRequest(_GenerationRequest, kw_only=True):
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    tools: Any = None  # counted in the prompt, as chat templates render them
    tool_choice: str | dict[str, Any] | None = None  # "required" or a named one: a tool call
    logprobs: bool | None = False
    top_logprobs: TopLogprobs | None = None
    reasoning_effort: str | None = None  # a reasoning model's share of reasoning
    chat_template_kwargs: dict[str, Any] | None = None  # `enable_thinking: false`: none

    @property
    def reasoning(self) -> float | None:
        """The reply's reasoning share as the engine takes it (None: its default)."""
        kwargs = self.chat_template_kwargs or {}
        if kwargs.get("enable_thinking") is False:
            return 0.0
        return effort_share(self.reasoning_effort, "$.reasoning_effort")

    @property
    def top(self) -> int | None:
        """How many alternatives per token (None: no logprobs)."""
        if self.top_logprobs is not None and not self.logprobs:
            raise invalid("top_logprobs needs logprobs: true - at `$.top_logprobs`")
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_GenerationRequest, kw_only=True):
    prompt: str | list[str | int | list[int]]
    max_tokens: NonNegativeInt | None = None  # 0 with echo: the prompt only (its logprobs)
    max_completion_tokens: PositiveInt | None = None  # accepted for symmetry
    echo: bool | None = False
    logprobs: TopLogprobs | None = None  # completions: the alternatives per token

    @property
    def top(self) -> int | None:
        return self.logprobs


_chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)


def decode_request(body: bytes, chat: bool) -> ChatCompletionRequest | CompletionRequest:
    """Parse and validate a generation body; GatewayError(invalid_request) names the field."""
    return decode(_chat_decoder if chat else _completion_decoder, body)


# ---- the prompt as token IDs ----------------------------------------------------------------


def chat_prompt(tokenizer: Tokenizer, messages: list[ChatMessage],
                tools: Any = None) -> Sequence[int]:
    """The conversation's token IDs (built-in tokenizer: 3 + ceil(content bytes / 4) per
    message, plus 3 for the reply's priming); an assistant's tool calls count as their
    name and arguments, the tool definitions as their JSON in a first message."""
    return conversation_ids(tokenizer, with_tools([(m.role, m.text()) for m in messages], tools))


def completion_prompts(prompt: str | list[str | int | list[int]]) -> list[str | list[int]]:
    """A completions `prompt` as its prompts: a string or a list of token ids is one; a
    list of strings or a list of lists of token ids is a batch (one engine request each,
    at most MAX_PROMPTS), as OpenAI and vLLM take them."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise invalid("`prompt` must not be empty - at `$.prompt`")
    kinds = {type(item) for item in prompt}
    if kinds == {int}:
        return [prompt]  # type: ignore[list-item]
    if kinds != {str} and kinds != {list}:
        raise invalid("Mixed prompts: `prompt` is a string, a list of token ids, a list of "
                      "strings or a list of lists of token ids - at `$.prompt`")
    if len(prompt) > MAX_PROMPTS:
        raise invalid(f"Too many prompts: at most {MAX_PROMPTS} in one request, got "
                      f"{len(prompt)} - at `$.prompt`")
    for i, item in enumerate(prompt):
        if not item and isinstance(item, list):
            raise invalid(f"A prompt of token ids must not be empty - at `$.prompt[{i}]`")
    return prompt  # type: ignore[return-value]


def prompt_ids(tokenizer: Tokenizer, prompt: str | list[int],
               where: str = "$.prompt") -> Sequence[int]:
    """One prompt's token IDs: a string's, or the ids given."""
    if isinstance(prompt, str):
        return text_ids(tokenizer, prompt)
    return checked_ids(prompt, where)


def completion_prompt(tokenizer: Tokenizer,
                      prompt: str | list[str | int | list[int]]) -> Sequence[int]:
    """A `prompt` that must be one prompt (vLLM's /tokenize): a string, a list of one
    string, or token ids (flat or [[...]])."""
    prompts = completion_prompts(prompt)
    if len(prompts) > 1:
        raise invalid("One prompt here: a string or token ids, not a list of several - "
                      "at `$.prompt`")
    return prompt_ids(tokenizer, prompts[0])
