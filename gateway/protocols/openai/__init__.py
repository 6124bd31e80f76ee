"""OpenAI chat completions and (text) completions: the two dialects.

`schemas` parses and checks the request bodies and builds their prompts; `render` shapes
the responses (SSE chunks and JSON bodies). A dialect here turns a body into a
`Generation` (or a `Batch` of several prompts) with the reply that renders it: chat's
forced tool call (`tool_choice` "required" or named) as `ChatToolCall`, every other reply
as `Completion`; completions' `max_tokens` 0 with `echo` as the prompt alone (the engine
runs it with one token, as vLLM does).

Does not know: aiohttp, gRPC, or the engine's events (`gateway.protocols.generate`).
"""

from __future__ import annotations

from functools import partial

from inference_lab.common.tokenizer import Tokenizer
from inference_lab.gateway.protocols.base import PLACEHOLDER_TOKEN, Batch, Dialect, Generation, invalid
from inference_lab.gateway.protocols.openai.render import (
    ChatToolCall, Completion, CompletionBatch, echoed,
)
from inference_lab.gateway.protocols.openai.schemas import (
    MAX_SEQUENCES, chat_prompt, completion_prompts, decode_request, prompt_ids,
)
from inference_lab.gateway.toolcalls import chat_forced


class ChatCompletions(Dialect):
    name = "openai.chat"
    api = "Chat Completions"

    def parse(self, body: bytes, tokenizer: Tokenizer) -> Generation:
        req = decode_request(body, chat=True)
        prompt = chat_prompt(tokenizer, req.messages, req.tools)
        cap = req.max_completion_tokens or req.max_tokens
        n = req.n or 1
        seed = req.seed if req.seed is not None else 0  # the same arguments as the other APIs
        call = chat_forced(req.tools, req.tool_choice, seed, PLACEHOLDER_TOKEN)
        if call is not None:
            reply = partial(ChatToolCall, req.model, call, n, req.include_usage,
                            req.continuous_usage, len(prompt))
            return Generation(req.model, prompt, cap, bool(req.stream), reply,
                              n=n, priority=req.priority)
        reply = partial(Completion, True, req.model, req.include_usage, n,
                        continuous_usage=req.continuous_usage, prompt_tokens=len(prompt),
                        cap=cap, top=req.top)
        return Generation(req.model, prompt, cap, bool(req.stream), reply,
                          n=n, priority=req.priority, reasoning=req.reasoning,
                          kv_transfer=req.kv_transfer_params)


class Completions(Dialect):
    name = "openai.completions"
    api = "Completions"

    def parse(self, body: bytes, tokenizer: Tokenizer) -> Generation | Batch:
        req = decode_request(body, chat=False)
        given = completion_prompts(req.prompt)
        cap = req.max_completion_tokens or req.max_tokens
        if cap == 0 and not req.echo:
            raise invalid("max_tokens 0 needs echo: true (the prompt only, with its "
                          "logprobs) - at `$.max_tokens`")
        # max_tokens 0: the engine prefills and makes one token, as vLLM does; not shown
        engine_cap = 1 if cap == 0 else cap
        n = req.n or 1
        if len(given) * n > MAX_SEQUENCES:
            raise invalid(f"Too many sequences: {len(given)} prompts x n = {n} is "
                          f"{len(given) * n}; at most {MAX_SEQUENCES} in one request - at `$.n`")
        prompts = [prompt_ids(tokenizer, p, f"$.prompt[{i}]" if len(given) > 1 else "$.prompt")
                   for i, p in enumerate(given)]
        shown = [echoed(tokenizer, p, ids, req.top) if req.echo else (None, None)
                 for p, ids in zip(given, prompts)]
        if len(given) > 1:  # a batch: one engine request per prompt
            batch = partial(CompletionBatch, req.model, [text for text, _ in shown],
                            [len(p) for p in prompts], req.include_usage, n,
                            req.continuous_usage, cap, req.top, [lp for _, lp in shown])
            return Batch(req.model, prompts, engine_cap, bool(req.stream), batch,
                         n=n, priority=req.priority)
        (prompt,), ((echo, logprobs),) = prompts, shown
        reply = partial(Completion, False, req.model, req.include_usage, n, echo=echo,
                        continuous_usage=req.continuous_usage, prompt_tokens=len(prompt),
                        cap=cap, top=req.top, prompt_logprobs=logprobs)
        return Generation(req.model, prompt, engine_cap, bool(req.stream), reply,
                          n=n, priority=req.priority, kv_transfer=req.kv_transfer_params)


CHAT = ChatCompletions()
COMPLETIONS = Completions()
