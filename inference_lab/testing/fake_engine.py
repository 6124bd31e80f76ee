"""A fake engine for tests of the gateway (and of anything else that speaks engine.proto).

Knows: the engine's gRPC contract as the gateway sees it, with behaviour chosen by a flag
rather than simulated: `mode` decides what an Open gets ("complete": admitted, a first
token, the rest coalesced into one Tokens event, finished; "reject": QUEUE_SATURATED with
metadata; "hold": admitted, then nothing until cancelled; "partial": admitted and one
token, then nothing; "silent": no answer at all). The engine's own rules decide what
they decide there (engine.sim: the output length when max_tokens is absent, the capacity
ranges, the refusal text), so the fake cannot drift from them; unknown models and
requests longer than max_model_len are refused like the engine does. `announce(state)`
pushes a QueueState to every open Session, as the engine does when a queue fills or
empties. With `stamp_age` set, every ProgressBatch carries sent_monotonic_s that many
seconds before it is written (as if the gateway read it that late). Every Open, Cancel,
Refused report, lateness report (SessionActions.relay_lag_s) and hold (hold_s, with the
Opens of its message) is recorded, with events a test can await
(never sleep to synchronise). It can be stopped and restarted on the same port.

Does not know: timing, batching or scheduling; it is not the engine.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import grpc

from inference_lab.engine.sim.capacity import Capacity, CapacityError
from inference_lab.engine.sim.core import QueueSaturated
from inference_lab.engine.sim.lengths import OutputLength
from inference_lab.v1 import engine_pb2 as pb
from inference_lab.v1 import engine_pb2_grpc as pb_grpc

FAKE_MODEL = "fake-model"
MAX_NUM_BATCHED_TOKENS = 8192


@dataclass(slots=True)
class _Model:
    max_model_len: int
    capacity: Capacity = Capacity(256, 0)


@dataclass(slots=True)
class _Recorder:
    """Items plus a condition to await "at least n have arrived"."""

    items: list = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def add(self, item: object) -> None:
        async with self.changed:
            self.items.append(item)
            self.changed.notify_all()

    async def wait(self, n: int = 1, timeout: float = 5.0) -> list:
        async def _wait() -> None:
            async with self.changed:
                await self.changed.wait_for(lambda: len(self.items) >= n)

        async with asyncio.timeout(timeout):
            await _wait()
        return list(self.items)


class FakeEngine(pb_grpc.EngineServicer):
    def __init__(self, models: dict[str, int] | None = None,
                 default_max_tokens: int | None = None) -> None:
        self.models = {name: _Model(n) for name, n in (models or {FAKE_MODEL: 4096}).items()}
        self.lengths = OutputLength(*(() if default_max_tokens is None else (default_max_tokens,)))
        self.mode = "complete"
        self.saturation = (64, 64)  # (waiting, max_waiting) under mode "reject"
        self.capacity_reply_states: list[pb.QueueState] | None = None  # SetCapacity's, when set
        self.opened = _Recorder()  # pb.Open
        self.cancelled = _Recorder()  # tags
        self.refused = _Recorder()  # pb.Refused reports
        self.relay_lags = _Recorder()  # SessionActions.relay_lag_s, as reported
        self.holds = _Recorder()  # (SessionActions.hold_s, Open tags in that message), in order
        self.stamp_age: float | None = None  # batches stamped this long before their write
        self.sessions = _Recorder()  # one entry per Session started
        self._outs: set[asyncio.Queue] = set()
        self.server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self, port: int = 0) -> int:
        self.server = grpc.aio.server()
        pb_grpc.add_EngineServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        await self.server.start()
        return self.port

    async def stop(self, grace: float | None = None) -> None:
        if self.server is not None:
            await self.server.stop(grace)
            self.server = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    # ---- Session ---------------------------------------------------------------------------

    async def Session(self, request_iterator, context):
        out: asyncio.Queue[pb.ProgressBatch | None] = asyncio.Queue()
        held: set[int] = set()
        self._outs.add(out)
        await self.sessions.add(context)

        async def read() -> None:
            async for message in request_iterator:
                if message.HasField("relay_lag_s"):
                    await self.relay_lags.add(message.relay_lag_s)
                if message.HasField("hold_s"):
                    await self.holds.add((message.hold_s, [a.open.tag for a in message.actions
                                                           if a.HasField("open")]))
                for action in message.actions:
                    if action.HasField("open"):
                        await self.opened.add(action.open)
                        self._answer(action.open, out, held)
                    elif action.HasField("cancel"):
                        tag = action.cancel.tag
                        await self.cancelled.add(tag)
                        if tag in held:
                            held.discard(tag)
                            out.put_nowait(_batch(_finished(tag, pb.FINISH_REASON_CANCELLED, 0)))
                    elif action.HasField("refused"):
                        await self.refused.add(action.refused)
            out.put_nowait(None)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while (batch := await out.get()) is not None:
                if self.stamp_age is not None:
                    batch.sent_monotonic_s = time.monotonic() - self.stamp_age
                await context.write(batch)
        finally:
            self._outs.discard(out)
            reader.cancel()

    def announce(self, state: pb.QueueState) -> None:
        """Push a queue state to every open Session (as the engine does on a change)."""
        for out in self._outs:
            out.put_nowait(pb.ProgressBatch(queue_states=[state]))

    def _answer(self, op: pb.Open, out: asyncio.Queue, held: set[int]) -> None:
        tag, req = op.tag, op.request
        model = self.models.get(req.model)
        if model is None:
            out.put_nowait(_batch(_rejected(tag, 5, "MODEL_NOT_FOUND",
                                            f"unknown model {req.model!r}")))
            return
        n = self.lengths.choose(req.max_tokens if req.HasField("max_tokens") else None,
                                req.prompt_tokens, model.max_model_len)
        if req.prompt_tokens + n > model.max_model_len:
            out.put_nowait(_batch(_rejected(
                tag, 3, "INVALID_REQUEST",
                f"prompt_tokens + max_tokens = {req.prompt_tokens + n} exceeds "
                f"max_model_len {model.max_model_len}",
            )))
            return
        if self.mode == "silent":
            return
        if self.mode == "reject":
            full = QueueSaturated(req.model, *self.saturation)
            meta = {"model": req.model, "waiting": str(full.waiting),
                    "max_waiting": str(full.max_waiting)}
            out.put_nowait(_batch(_rejected(tag, 8, "QUEUE_SATURATED", str(full), meta)))
            return
        admitted = pb.Progress(tag=tag, admitted=pb.Admitted(engine_request_id=tag, waiting=1))
        if self.mode == "hold":
            held.add(tag)
            out.put_nowait(_batch(admitted))
            return
        if self.mode == "partial":
            held.add(tag)
            out.put_nowait(_batch(admitted, _tokens(tag, 1, 1)))
            return
        out.put_nowait(_batch(admitted))
        out.put_nowait(_batch(_tokens(tag, 1, 1)))  # the first token alone (TTFT)
        last = []
        if n > 1:
            last.append(_tokens(tag, n - 1, n))  # the rest coalesced into one event
        last.append(_finished(tag, pb.FINISH_REASON_LENGTH, n, req.prompt_tokens))
        out.put_nowait(_batch(*last))

    # ---- unary ----------------------------------------------------------------------------

    async def ListModels(self, request, context):
        return pb.ListModelsResponse(models=[
            pb.ModelInfo(name=name, hardware="fake", tp=1, max_model_len=m.max_model_len,
                         kv_blocks=1000, block_size=16, max_request_tokens=m.max_model_len)
            for name, m in self.models.items()
        ])

    async def _selected(self, model: str, context) -> list[str]:
        if not model:
            return list(self.models)
        if model not in self.models:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model {model!r}")
        return [model]

    def _capacity(self, names: list[str]) -> list[pb.ModelCapacity]:
        return [pb.ModelCapacity(model=n, max_waiting=self.models[n].capacity.max_waiting,
                                 max_num_seqs=self.models[n].capacity.max_num_seqs,
                                 waiting=0, running=0)
                for n in names]

    async def GetCapacity(self, request, context):
        return pb.CapacityResponse(models=self._capacity(await self._selected(request.model, context)))

    async def SetCapacity(self, request, context):
        seqs = request.max_num_seqs if request.HasField("max_num_seqs") else None
        waiting = request.max_waiting if request.HasField("max_waiting") else None
        names = await self._selected(request.model if request.HasField("model") else "", context)
        try:
            changed = {n: self.models[n].capacity.changed(MAX_NUM_BATCHED_TOKENS, seqs, waiting)
                       for n in names}
        except CapacityError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        for name, capacity in changed.items():
            self.models[name].capacity = capacity
        return pb.SetCapacityResponse(models=self._capacity(names), queue_states=(
            self.capacity_reply_states if self.capacity_reply_states is not None
            else [pb.QueueState(model=n) for n in names]))  # nothing ever waits here


def saturated_state(model: str, waiting: int, max_waiting: int, since: float = 0.0,
                    until: float = float("inf")) -> pb.QueueState:
    """A QueueState saying `model` is full, with the engine's own refusal text, for the
    arrivals stamped in [since, until) (time.monotonic(); by default any)."""
    return pb.QueueState(model=model, saturated=True, waiting=waiting, max_waiting=max_waiting,
                         message=str(QueueSaturated(model, waiting, max_waiting)),
                         since_monotonic_s=since, until_monotonic_s=until)


def _batch(*events: pb.Progress) -> pb.ProgressBatch:
    return pb.ProgressBatch(events=list(events))


def _tokens(tag: int, new: int, total: int) -> pb.Progress:
    return pb.Progress(tag=tag, tokens=pb.Tokens(new_tokens=new, total_tokens=total))


def _finished(tag: int, reason: int, completion: int, prompt: int = 0) -> pb.Progress:
    return pb.Progress(tag=tag, finished=pb.Finished(
        reason=reason, prompt_tokens=prompt, completion_tokens=completion))


def _rejected(tag: int, code: int, reason: str, message: str,
              metadata: dict[str, str] | None = None) -> pb.Progress:
    return pb.Progress(tag=tag, rejected=pb.Rejected(
        code=code, reason=reason, message=message, metadata=metadata or {}))
