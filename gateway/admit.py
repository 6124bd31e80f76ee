"""A generation request's admission at this gateway: the one decision, taken once.

Knows: whether a parsed request (one prompt or a batch of them) is refused here, at once,
on the engine's word: `refused` asks the engine client's copy of the engine's "full"
spans (gateway.admission) for each prompt, with the request's arrival stamp, resolved
model and replica; a batch is refused when any prompt is (each refused prompt counted for
the engine's `Refused` report, as the engine counts each). Everything it does not refuse
goes to the engine, which judges it at its arrival instant.

Who asks: the generation handler (gateway.generation) and the edge's fast path for the
same routes (`generation.fast_refusal`), each once per request and with the same state,
so they give the same answer. `EngineClient.open` does not decide again: it sends what it
is given. A request decided while no Session was live (the client connects in `open`)
goes to the engine, which refuses it itself if the queue is full: the same status and
envelope, counted by the engine.

Does not know: HTTP, how a refusal is rendered (gateway.errors), the Session.
"""

from __future__ import annotations

from inference_lab.gateway.engine_client import EngineClient
from inference_lab.gateway.protocols.base import Batch, Generation


def refused(client: EngineClient, gen: Generation | Batch, replica: int | None,
            arrived: float | None) -> str | None:
    """The engine's saturation message when `gen` (its model resolved), which arrived at
    `arrived` (time.monotonic(); None: now), is refused here on the engine's word, else
    None (it goes to the engine)."""
    if isinstance(gen, Batch):
        messages = [client.refusal(gen.model, len(prompt), gen.max_tokens, gen.n, replica,
                                   arrived)
                    for prompt in gen.prompts]
        return next((message for message in messages if message is not None), None)
    return client.refusal(gen.model, gen.prompt_tokens, gen.max_tokens, gen.n, replica, arrived)
