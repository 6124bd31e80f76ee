"""The Sleep call: vLLM's sleep mode (/sleep, /wake_up) over the fleet's replicas.

Knows: the call's checks (sleep mode on, a level of 1 or 2, tags vLLM knows), which replicas it acts on (one model or all, one index or
all), and that each replica sleeps or wakes itself (engine.fleet.runtime: what a sleep
frees, what a wake costs); the answer is their capacity rows, which carry each one's
sleep level and last wake's cost. Mixed into the servicer (engine.service.rpc).

Does not know: HTTP (the gateway's /sleep, /wake_up and /is_sleeping:
gateway.sleep), the cost arithmetic (engine.fleet.sleep), the secret the call needs (the
control token, checked by the server's interceptor before the handler runs:
engine.service.access).
"""

from __future__ import annotations

import logging

import grpc

from inference_lab.engine.fleet.sleep import LEVELS, check_tags
from inference_lab.v1 import engine_pb2 as pb

log = logging.getLogger(__name__)


class SleepRpcs:
    """`Sleep` over the servicer's fleet (needs its `_replicas_of`, `_capacity` and
    `sleep_mode`)."""

    sleep_mode = False  # the engine runs with --enable-sleep-mode

    async def Sleep(self, request: pb.SleepRequest, context):
        replicas = await self._replicas_of(request, context)
        if not self.sleep_mode:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "sleep mode is off: start the engine with --enable-sleep-mode")
        if request.wake:
            try:
                tags = check_tags(list(request.tags))
            except ValueError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"tags: {exc}")
            for r in replicas:
                cost = r.runtime.wake(tags)
                log.info("woke %s replica %d (%s): %.3f s to reload", r.model, r.index,
                         ", ".join(sorted(tags)), cost)
        else:
            if request.level not in LEVELS:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"level must be 1 or 2, got {request.level}")
            for r in replicas:
                aborted = r.runtime.sleep(request.level)
                log.info("%s replica %d sleeps at level %d (%d requests aborted)",
                         r.model, r.index, r.runtime.sleep_level, aborted)
        if self.metrics is not None:
            self.metrics.touch()
        return pb.CapacityResponse(models=self._capacity(replicas))
