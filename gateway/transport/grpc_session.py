"""The Session as the engine's gRPC stream `Session` (engine.proto).

Knows: the bidirectional stream: an outbox queue feeding its request iterator (every
action queued by the time gRPC is ready for the next message goes in it), a dispatcher
task reading its ProgressBatches into `Session._on_batch`, and the clock id sent as call
metadata (an engine on this machine books arrivals at our stamps), with the gateway's
secret when it has one.

Does not know: what the actions mean (gateway.transport.session), the lane, HTTP.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

import grpc

from inference_lab.common.clock import CLOCK_METADATA, clock_id
from inference_lab.gateway.backlog import Backlog
from inference_lab.gateway.transport.session import HOLD_DUE, LAG_DUE, Probe, Session
from inference_lab.v1 import engine_pb2 as pb
from inference_lab.v1 import engine_pb2_grpc as pb_grpc

log = logging.getLogger("inference_lab.gateway.engine_client")  # the engine client's one logger


class GrpcSession(Session):
    """The Session as the gRPC stream `Session`: the outbox feeds its request iterator,
    a dispatcher task reads its batches."""

    transport = "grpc"

    def __init__(self, stub: pb_grpc.EngineStub, on_broken: Callable[["Session"], None],
                 probe: Probe | None = None, backlog: Backlog | None = None,
                 metadata: tuple[tuple[str, str], ...] | None = None) -> None:
        super().__init__(on_broken, probe, backlog)
        self._outbox: asyncio.Queue[pb.SessionAction | None] = asyncio.Queue()
        clock = clock_id()  # an engine on this machine books arrivals at our stamps
        metadata = (*(((CLOCK_METADATA, clock),) if clock else ()), *(metadata or ()))
        self.call = stub.Session(self._actions(), wait_for_ready=False,
                                 metadata=metadata or None)
        self.task = self._loop.create_task(self._dispatch(), name="engine-session")

    def _post(self, item: pb.SessionAction | None) -> None:
        self._outbox.put_nowait(item)

    def _stop(self) -> None:
        self._outbox.put_nowait(None)
        self.call.cancel()

    async def _actions(self):  # the request iterator grpc.aio consumes
        """Every action queued by the time gRPC is ready for the next message goes in it:
        a burst of requests costs one message, not one each; a due lateness report rides
        along (or goes alone)."""
        outbox = self._outbox
        while True:
            action = await outbox.get()
            if action is None:
                return
            actions = [] if action is LAG_DUE or action is HOLD_DUE else [action]
            end = False
            while not outbox.empty():
                action = outbox.get_nowait()
                if action is None:
                    end = True
                    break
                if action is not LAG_DUE and action is not HOLD_DUE:
                    actions.append(action)
            message = self._message(actions)
            if message is not None:
                yield message
            if end:
                return

    async def _dispatch(self) -> None:
        reason = "the engine closed the session"
        try:
            async for batch in self.call:
                self._on_batch(batch)
        except grpc.aio.AioRpcError as exc:
            reason = f"session lost ({exc.code().name}: {exc.details()})"
        except asyncio.CancelledError:
            reason = "the gateway is shutting down"
            raise
        except Exception as exc:  # a bug must not leave requests hanging
            log.exception("engine session dispatcher failed")
            reason = f"session dispatcher failed: {exc!r}"
        finally:
            self.close(reason)
