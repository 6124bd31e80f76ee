"""OpenAI chat completions and (text) completions: the response bytes.

Knows: the replies of /v1/chat/completions and /v1/completions, streamed and not: `n`
choices (parallel sampling: `index` per choice, usage counting every choice), `echo` on
completions (the prompt text before the completion, and with `logprobs` the prompt's own:
`echoed`), several prompts in one completions request (`CompletionBatch` numbers its
choices prompt-major and sums the usage), chat's forced tool call (`ChatToolCall`, its
arguments from gateway.toolcalls), per-request pre-encoded SSE chunk templates so that k
coalesced tokens cost one `bytes * k`, the final chunks, the usage frame (`choices: []`),
`[DONE]`, and the non-streaming JSON body.

Does not know: request bodies (gateway.protocols.openai.schemas), aiohttp, gRPC, or the
engine's events (`gateway.protocols.generate`).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence

from inference_lab.common.tokenizer import Tokenizer
from inference_lab.gateway.errors import GatewayError, sse_error_frame
from inference_lab.gateway.protocols.base import (
    DONE_FRAME, PLACEHOLDER_TOKEN, BatchReply, Outcome, Reply, data_frame, json_encode, random_id,
)
from inference_lab.gateway.protocols.reasoning import Split
from inference_lab.gateway.toolcalls import ForcedCall

UNLIKELY = -9999.0  # the log-probability vLLM reports for -inf: every other token's


def prompt_logprob(token: str) -> float:
    """An echoed prompt token's log-probability: synthetic, negative and deterministic
    (from the token's text alone, in [-10.24, -0.25]), so that the sums an evaluation
    harness makes over a continuation's tokens differ between continuations and repeat
    across runs. (Generated tokens, all the placeholder, stay at 0.0.)"""
    return round(-0.25 - (zlib.crc32(token.encode("utf-8", "surrogatepass")) % 1000) / 100, 2)


def echoed(tokenizer: Tokenizer, prompt: str | list[int], ids: Sequence[int],
           top: int | None) -> tuple[str, dict | None]:
    """One prompt as `echo` returns it: its text (token ids: as the tokenizer decodes
    them), and with `logprobs` (`top` alternatives) the prompt's own logprobs in the
    completions shape, as vLLM and OpenAI's legacy API give them: each token as the
    tokenizer renders it, its offset in the echoed text, its log-probability (null for
    the first token, which nothing predicts) and its top alternatives (null for the
    first; else the token itself and `top` - 1 placeholders at UNLIKELY)."""
    decoded, tokens, offsets = tokenizer.pieces(ids)
    text = prompt if isinstance(prompt, str) else decoded
    if top is None:
        return text, None
    if decoded != text:  # (a string prompt the tokenizer cannot give back exactly)
        offsets = [min(offset, len(text)) for offset in offsets]
    values: list[float | None] = [None]
    tops: list[dict | None] = [None]
    others = [PLACEHOLDER_TOKEN] + [f"{PLACEHOLDER_TOKEN}{j}" for j in range(1, top + 1)]
    for token in tokens[1:]:
        value = prompt_logprob(token)
        values.append(value)
        alternatives = {token: value}
        for other in others:
            if len(alternatives) >= max(top, 1):
                break
            alternatives.setdefault(other, UNLIKELY)
        tops.append(alternatives)
    return text, {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
                  "text_offset": offsets}


def _usage(outcome: Outcome, split: Split | None = None) -> dict:
    prompt, completion = outcome.prompt_tokens, outcome.completion_tokens
    usage = {"prompt_tokens": prompt, "completion_tokens": completion,
             "total_tokens": prompt + completion,
             "prompt_tokens_details": {"cached_tokens": outcome.cached_tokens}}
    if split is not None:  # a reasoning model's reply: how much of it was reasoning
        usage["completion_tokens_details"] = {
            "reasoning_tokens": sum(split.of(count) for count in outcome.counts)}
    return usage


class Completion(Reply):
    """The response of one request, chat or text completion, in either mode, with `n`
    choices. Streaming: the chat role delta (and an `echo`ed prompt) goes out with the
    first token(s); each choice's per-token chunk is pre-encoded once."""

    __slots__ = ("chat", "id", "created", "model", "include_usage", "n", "echo", "head",
                 "token", "_tokens", "continuous", "prompt_tokens", "emitted", "cap", "top",
                 "_offsets", "base", "prompt_logprobs", "prompt_only", "split", "_thinking")

    def __init__(self, chat: bool, model: str, include_usage: bool = False, n: int = 1,
                 echo: str | None = None, continuous_usage: bool = False,
                 prompt_tokens: int = 0, cap: int | None = None, top: int | None = None,
                 base: int = 0, prompt_logprobs: dict | None = None) -> None:
        self.chat = chat
        self.base = base  # the index of its first choice (a batch's prompt p: p * n)
        # logprobs asked for: how many alternatives per token (every generated token is the
        # placeholder, at log-probability 0; the alternatives at vLLM's -inf, -9999.0)
        self.top = top
        # completions with logprobs, streamed: each chunk's text_offset differs, so chunks
        # are made one by one (each choice's characters so far)
        self._offsets = [len(echo or "")] * n if top is not None and not chat else None
        self.cap = cap  # the client's explicit max_tokens: reaching it is "length"
        # completions with echo and logprobs: the echoed prompt's own (`echoed`)
        self.prompt_logprobs = prompt_logprobs
        # max_tokens 0 (with echo): the engine ran the request with 1 token, as vLLM does;
        # the reply is the prompt only and counts no completion tokens
        self.prompt_only = cap == 0
        self.id = ("chatcmpl-" if chat else "cmpl-") + random_id()
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage
        self.n = n
        self.echo = echo  # completions: the prompt text to put before the completion
        self.head: bytes | None = None  # the opening, once start_stream() made it
        self.token = b""  # choice 0's per-token chunk (a fault may swap it: gateway.faults)
        self._tokens: list[bytes] = []  # every choice's per-token chunk
        # vLLM's continuous_usage_stats: every chunk carries the usage so far, so chunks
        # are made one by one instead of from the pre-encoded template.
        self.continuous = continuous_usage
        self.prompt_tokens = prompt_tokens
        self.emitted = 0  # tokens streamed so far, every choice
        # a reasoning model's reply (chat): each choice's first tokens are reasoning, in
        # `reasoning_content` deltas as vLLM's reasoning parsers stream them
        self.split: Split | None = None
        self._thinking: list[bytes] = []  # every choice's per-token reasoning chunk

    def reasoned(self, tokens: int) -> None:
        if self.chat:
            self.split = Split(tokens, self.n)

    def _running_usage(self) -> dict[str, int]:
        prompt, completion = self.prompt_tokens, self.emitted
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}

    def _chunk(self, choices: list[dict], **extra: object) -> dict:
        chunk: dict = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.continuous:
            chunk["usage"] = self._running_usage()
        elif self.include_usage:
            chunk["usage"] = None  # as OpenAI does on every chunk but the usage frame
        chunk.update(extra)
        return chunk

    def _logprobs(self, count: int, offset: int = 0) -> dict | None:
        """`count` placeholder tokens' logprobs in the API's shape (None when not asked):
        chat {content: [{token, logprob, bytes, top_logprobs}], refusal}; completions
        {tokens, token_logprobs, top_logprobs, text_offset} from character `offset`."""
        if self.top is None or count == 0:
            return None
        alternatives = [PLACEHOLDER_TOKEN] + [f"{PLACEHOLDER_TOKEN}{j}" for j in range(1, self.top)]
        if self.chat:
            top = [{"token": t, "logprob": 0.0 if j == 0 else UNLIKELY, "bytes": list(t.encode())}
                   for j, t in enumerate(alternatives[:self.top])]
            entry = {"token": PLACEHOLDER_TOKEN, "logprob": 0.0,
                     "bytes": list(PLACEHOLDER_TOKEN.encode()), "top_logprobs": top}
            return {"content": [entry] * count, "refusal": None}
        top = {t: 0.0 if j == 0 else UNLIKELY for j, t in enumerate(alternatives)}
        step = len(PLACEHOLDER_TOKEN)
        return {"tokens": [PLACEHOLDER_TOKEN] * count, "token_logprobs": [0.0] * count,
                "top_logprobs": [top] * count,
                "text_offset": [offset + step * i for i in range(count)]}

    def _completion_logprobs(self, count: int) -> dict | None:
        """A whole completions choice's logprobs: the echoed prompt's first (with echo),
        then the `count` generated tokens', their offsets after the echoed text."""
        generated = self._logprobs(count, len(self.echo or ""))
        prompt = self.prompt_logprobs
        if prompt is None or generated is None:
            return prompt if generated is None else generated
        return {key: prompt[key] + generated[key] for key in prompt}

    def _shown(self, outcome: Outcome) -> Outcome:
        """The outcome as the reply tells it: with max_tokens 0, no completion tokens."""
        if not self.prompt_only:
            return outcome
        return Outcome(outcome.prompt_tokens, [0] * len(outcome.counts), outcome.modelled,
                       outcome.cached_tokens)

    def _choice(self, index: int, text: str | None, finish_reason: str | None,
                role: bool = False, offset: int = 0, echo: bool = False) -> dict:
        if echo:
            logprobs = self.prompt_logprobs
        else:
            logprobs = self._logprobs(1, offset) if text == PLACEHOLDER_TOKEN else None
        if self.chat:
            delta: dict = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            return {"index": self.base + index, "delta": delta, "logprobs": logprobs,
                    "finish_reason": finish_reason}
        return {"index": self.base + index, "text": text or "", "logprobs": logprobs,
                "finish_reason": finish_reason}

    def start_stream(self) -> None:
        """Pre-encode the opening (chat: every choice's role delta; completions with echo:
        every choice's prompt text) and each choice's per-token chunk."""
        if self.chat:
            self.head = b"".join(data_frame(self._chunk([self._choice(i, None, None, role=True)]))
                                 for i in range(self.n))
        elif self.echo:
            self.head = b"".join(data_frame(self._chunk([self._choice(i, self.echo, None,
                                                                      echo=True)]))
                                 for i in range(self.n))
        else:
            self.head = b""
        self._tokens = [data_frame(self._chunk([self._choice(i, PLACEHOLDER_TOKEN, None)]))
                        for i in range(self.n)]
        self.token = self._tokens[0]
        if self.split is not None:
            self._thinking = [data_frame(self._chunk([self._thought(i)])) for i in range(self.n)]

    def _thought(self, index: int) -> dict:
        """A choice's chunk of one reasoning token."""
        return {"index": self.base + index, "delta": {"reasoning_content": PLACEHOLDER_TOKEN},
                "logprobs": None, "finish_reason": None}

    def opening(self) -> bytes:
        if self.head is None:
            self.start_stream()
        return self.head

    def tokens(self, index: int, k: int) -> bytes:
        if self.head is None:
            self.start_stream()
        if self.prompt_only:
            return b""  # the engine's one token is not shown (max_tokens 0)
        if self.split is not None:
            thinking, k = self.split.take(index, k)
            if thinking:
                return self._thoughts(index, thinking) + (self._content(index, k) if k else b"")
        return self._content(index, k)

    def _thoughts(self, index: int, k: int) -> bytes:
        if self.continuous:
            out = []
            for _ in range(k):
                self.emitted += 1
                out.append(data_frame(self._chunk([self._thought(index)])))
            return b"".join(out)
        return self._thinking[index] * k

    def _content(self, index: int, k: int) -> bytes:
        if self.continuous or self._offsets is not None:
            out = []
            offsets = self._offsets
            for _ in range(k):
                self.emitted += 1
                offset = offsets[index] if offsets is not None else 0
                out.append(data_frame(self._chunk([self._choice(index, PLACEHOLDER_TOKEN, None,
                                                                offset=offset)])))
                if offsets is not None:
                    offsets[index] += len(PLACEHOLDER_TOKEN)
            return b"".join(out)
        return (self.token if index == 0 else self._tokens[index]) * k

    def _finish_reason(self, count: int) -> str:
        """"length" when the choice reached the client's max_tokens; "stop" when its length
        was the engine's choice (the default or a workload draw), as a model's end of turn."""
        return "length" if self.cap is not None and count >= self.cap else "stop"

    def closing(self, outcome: Outcome) -> bytes:
        """Each choice's final chunk (the last carries the engine's modelled timings,
        when given, under "inference_lab"), the usage frame if asked for, and [DONE]."""
        return self.finals(outcome) + self.tail(outcome)

    def finals(self, outcome: Outcome) -> bytes:
        """Each choice's final chunk (the last carries the engine's modelled timings,
        when given, under "inference_lab")."""
        out = b""
        outcome = self._shown(outcome)
        self.emitted = outcome.completion_tokens  # the final chunks carry the final usage
        counts = outcome.counts
        for i in range(self.n):
            last = i == self.n - 1 and outcome.modelled
            extra = {"inference_lab": outcome.modelled} if last else {}
            reason = self._finish_reason(counts[i] if i < len(counts) else 0)
            out += data_frame(self._chunk(
                [self._choice(i, None if self.chat else "", reason)], **extra))
        return out

    def tail(self, outcome: Outcome) -> bytes:
        """The stream's end: the usage frame if asked for (`outcome`'s), and [DONE]."""
        if self.include_usage:
            usage_chunk = self._chunk([])
            usage_chunk["usage"] = _usage(self._shown(outcome), self.split)
            return data_frame(usage_chunk) + DONE_FRAME
        return DONE_FRAME

    def choices(self, outcome: Outcome) -> list[dict]:
        """The non-streaming response's choices."""
        choices = []
        base = self.base
        outcome = self._shown(outcome)
        for i, count in enumerate(outcome.counts, base):
            text = PLACEHOLDER_TOKEN * count
            finish_reason = self._finish_reason(count)
            if self.chat:
                message = {"role": "assistant", "content": text}
                if self.split is not None:  # reasoning first, then the content (none: null)
                    thinking = self.split.of(count)
                    message = {"role": "assistant", "reasoning_content": PLACEHOLDER_TOKEN * thinking,
                               "content": PLACEHOLDER_TOKEN * (count - thinking) or None}
                choices.append({"index": i, "message": message,
                                "logprobs": self._logprobs(count), "finish_reason": finish_reason})
            else:
                choices.append({"index": i, "text": (self.echo or "") + text,
                                "logprobs": self._completion_logprobs(count),
                                "finish_reason": finish_reason})
        return choices

    def body(self, outcome: Outcome) -> bytes:
        """The non-streaming JSON response (modelled timings under "inference_lab")."""
        return self.envelope(self.choices(outcome), self._shown(outcome), outcome.modelled)

    def envelope(self, choices: list[dict], outcome: Outcome, modelled: dict) -> bytes:
        return json_encode({
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": _usage(outcome, self.split),
            # P/D: a remote-decode prefill names its handoff, as vLLM's response does
            **({"kv_transfer_params": outcome.kv_transfer_params}
               if outcome.kv_transfer_params is not None else {}),
            **({"inference_lab": modelled} if modelled else {}),
        })

    def error_frame(self, err: GatewayError) -> bytes:
        return sse_error_frame(err)


class ChatToolCall(Reply):
    """A chat completion whose choices each make the one tool call the request forced
    (`tool_choice` "required" or a named function): `message.tool_calls`, `content: null`,
    finish_reason "tool_calls". Streamed as OpenAI streams a call: each choice's first
    chunk carries the call's index, id, type, name and empty arguments; then one chunk per
    token, each an argument fragment (the first with the arguments' opening text); the
    closing text of the arguments in one chunk before the final one. The arguments follow
    the engine's token count (gateway.toolcalls.arguments), so the call is always whole:
    never "length". No logprobs (null)."""

    __slots__ = ("id", "created", "model", "call", "n", "include_usage", "continuous",
                 "prompt_tokens", "emitted", "call_ids", "_started", "_fragments")

    def __init__(self, model: str, call: ForcedCall, n: int = 1, include_usage: bool = False,
                 continuous_usage: bool = False, prompt_tokens: int = 0) -> None:
        self.id = "chatcmpl-" + random_id()
        self.created = int(time.time())
        self.model = model
        self.call = call
        self.n = n
        self.include_usage = include_usage
        self.continuous = continuous_usage  # vLLM's: the usage so far on every chunk
        self.prompt_tokens = prompt_tokens
        self.emitted = 0  # tokens streamed so far, every choice
        self.call_ids = ["call_" + random_id()[:24] for _ in range(n)]
        self._started = [False] * n  # whether a choice's arguments opened
        self._fragments: list[bytes] = []  # each choice's per-token chunk, pre-encoded

    def _chunk(self, index: int, delta: dict, finish_reason: str | None = None,
               **extra: object) -> bytes:
        chunk: dict = {"id": self.id, "object": "chat.completion.chunk",
                       "created": self.created, "model": self.model,
                       "choices": [{"index": index, "delta": delta, "logprobs": None,
                                    "finish_reason": finish_reason}]}
        if self.continuous:
            prompt, completion = self.prompt_tokens, self.emitted
            chunk["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion,
                              "total_tokens": prompt + completion}
        elif self.include_usage:
            chunk["usage"] = None  # as OpenAI does on every chunk but the usage frame
        chunk.update(extra)
        return data_frame(chunk)

    def _arguments(self, index: int, text: str) -> bytes:
        return self._chunk(index, {"tool_calls": [{"index": 0, "function": {"arguments": text}}]})

    def opening(self) -> bytes:
        name = self.call.name
        return b"".join(self._chunk(i, {"role": "assistant", "content": None, "tool_calls": [
            {"index": 0, "id": self.call_ids[i], "type": "function",
             "function": {"name": name, "arguments": ""}}]}) for i in range(self.n))

    def tokens(self, index: int, k: int) -> bytes:
        fragment = self.call.arguments.fragment
        out = b""
        if not self._started[index] and k > 0:
            self._started[index] = True
            self.emitted += 1
            out = self._arguments(index, self.call.arguments.prefix + fragment)
            k -= 1
        if self.continuous:
            for _ in range(k):
                self.emitted += 1
                out += self._arguments(index, fragment)
            return out
        if not self._fragments:
            self._fragments = [self._arguments(i, fragment) for i in range(self.n)]
        return out + self._fragments[index] * k

    def closing(self, outcome: Outcome) -> bytes:
        """Each choice's closing arguments and final chunk (the last with the engine's
        modelled timings), the usage frame if asked for, and [DONE]."""
        self.emitted = outcome.completion_tokens
        out = b""
        for i in range(self.n):
            args = self.call.arguments
            out += self._arguments(i, args.suffix if self._started[i] else args.prefix + args.suffix)
            extra = {"inference_lab": outcome.modelled} if i == self.n - 1 and outcome.modelled else {}
            out += self._chunk(i, {}, "tool_calls", **extra)
        if self.include_usage:
            out += data_frame({"id": self.id, "object": "chat.completion.chunk",
                               "created": self.created, "model": self.model, "choices": [],
                               "usage": _usage(outcome)})
        return out + DONE_FRAME

    def body(self, outcome: Outcome) -> bytes:
        choices = [{"index": i, "message": {"role": "assistant", "content": None, "tool_calls": [
            {"id": self.call_ids[i], "type": "function",
             "function": {"name": self.call.name, "arguments": self.call.arguments.text(count)}}]},
            "logprobs": None, "finish_reason": "tool_calls"} for i, count in enumerate(outcome.counts)]
        modelled = outcome.modelled
        return json_encode({"id": self.id, "object": "chat.completion", "created": self.created,
                            "model": self.model, "choices": choices, "usage": _usage(outcome),
                            **({"inference_lab": modelled} if modelled else {})})

    def error_frame(self, err: GatewayError) -> bytes:
        return sse_error_frame(err)


class CompletionPart(Completion):
    """Prompt p's choices in the stream of a request of several prompts (a batch): its
    closing is its own choices' final chunks; the usage frame and [DONE] come once every
    prompt finished (`CompletionBatch.closing`)."""

    __slots__ = ()

    def closing(self, outcome: Outcome) -> bytes:
        return self.finals(outcome)


def batch_outcome(outcomes: list[Outcome]) -> Outcome:
    """The prompts' outcomes as one, for the usage: every prompt's tokens and every choice's."""
    return Outcome(sum(o.prompt_tokens for o in outcomes),
                   [count for o in outcomes for count in o.counts],
                   cached_tokens=sum(o.cached_tokens for o in outcomes))


def batch_modelled(outcomes: list[Outcome]) -> dict:
    """A batch's modelled timings, as for n choices: the first prompt's queue time and
    TTFT, the end-to-end time of the last to finish, preemptions summed; and each prompt's
    own under "prompts"."""
    first = outcomes[0].modelled
    if not first:
        return {}
    every = [o.modelled for o in outcomes]
    return {**first, "e2e_s": max(m.get("e2e_s", 0.0) for m in every),
            "preemptions": sum(m.get("preemptions", 0) for m in every), "prompts": every}


class CompletionBatch(BatchReply):
    """The completions response of several prompts, prompt-major (prompt p's choice i is
    index p * n + i, as vLLM numbers them), under one id; usage sums over the prompts."""

    __slots__ = ("id", "parts")

    def __init__(self, model: str, echoes: list[str | None], prompt_lengths: list[int],
                 include_usage: bool = False, n: int = 1, continuous_usage: bool = False,
                 cap: int | None = None, top: int | None = None,
                 prompt_logprobs: list[dict | None] | None = None) -> None:
        logprobs = prompt_logprobs or [None] * len(echoes)
        self.parts = [CompletionPart(False, model, include_usage, n, echo=echo,
                                     continuous_usage=continuous_usage, prompt_tokens=length,
                                     cap=cap, top=top, base=p * n, prompt_logprobs=lp)
                      for p, (echo, length, lp)
                      in enumerate(zip(echoes, prompt_lengths, logprobs))]
        first = self.parts[0]
        self.id = first.id
        for part in self.parts:
            part.id, part.created = first.id, first.created

    def closing(self, outcomes: list[Outcome]) -> bytes:
        return self.parts[0].tail(batch_outcome(outcomes))  # (tail shows max_tokens 0's)

    def body(self, outcomes: list[Outcome]) -> bytes:
        choices = [c for part, o in zip(self.parts, outcomes) for c in part.choices(o)]
        shown = [part._shown(o) for part, o in zip(self.parts, outcomes)]
        return self.parts[0].envelope(choices, batch_outcome(shown), batch_modelled(outcomes))

    def error_frame(self, err: GatewayError) -> bytes:
        return sse_error_frame(err)

