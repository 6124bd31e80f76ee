"""The Pause and ResetPrefixCache calls: vLLM's dev-mode /pause, /resume and
/reset_prefix_cache over the fleet's replicas.

Knows: which replicas a call acts on (one model or all, one index or all), the order of
a pause (each replica pauses itself: engine.fleet.runtime; a "wait" pause answers once
every running request has finished, then, with `clear_cache`, the prefix caches are
emptied, as vLLM clears them once its pause took hold), that a resume re-applies the
replica faults (a stalled replica stays frozen), and that a reset publishes its KV event
at once. The answer of a pause is the replicas' capacity rows, which carry their pause
mode. Mixed into the servicer (engine.service.rpc).

Does not know: HTTP (the gateway's dev-mode routes: gateway.dev), whether the gateway
serves them (its --dev-mode; the calls are the engine's whatever it says), the secret
the calls need (the control token, checked by the server's interceptor before the
handler runs: engine.service.access).
"""

from __future__ import annotations

import asyncio
import logging

from inference_lab.v1 import engine_pb2 as pb

log = logging.getLogger(__name__)

# The proto's PauseMode as the replicas take it (UNSPECIFIED: vLLM's default, abort).
MODES = {pb.PAUSE_MODE_UNSPECIFIED: "abort", pb.PAUSE_MODE_ABORT: "abort",
         pb.PAUSE_MODE_WAIT: "wait", pb.PAUSE_MODE_KEEP: "keep"}
MODE_PB = {"": pb.PAUSE_MODE_UNSPECIFIED, "abort": pb.PAUSE_MODE_ABORT,
           "wait": pb.PAUSE_MODE_WAIT, "keep": pb.PAUSE_MODE_KEEP}


class DevRpcs:
    """`Pause` and `ResetPrefixCache` over the servicer's fleet (needs its `_replicas_of`,
    `_capacity`, `metrics` and `replica_faults`)."""

    async def Pause(self, request: pb.PauseRequest, context):
        replicas = await self._replicas_of(request, context)
        if request.resume:
            for r in replicas:
                r.runtime.resume()
            if self.replica_faults is not None:  # a stall outlives a pause
                self.replica_faults.apply([r.runtime for r in replicas])
            log.info("generation resumed on %d replicas", len(replicas))
        else:
            mode = MODES.get(request.mode, "abort")
            aborted = sum(r.runtime.pause(mode) for r in replicas)
            if mode == "wait":  # vLLM answers once the running requests have finished
                await asyncio.gather(*(r.runtime.settled() for r in replicas))
            if request.clear_cache and mode != "keep":
                for r in replicas:
                    r.runtime.reset_prefix_cache()
            log.info("generation paused (mode %s) on %d replicas, %d requests aborted",
                     mode, len(replicas), aborted)
        if self.metrics is not None:
            self.metrics.touch()
        return pb.CapacityResponse(models=self._capacity(replicas))

    async def ResetPrefixCache(self, request: pb.ResetPrefixCacheRequest, context):
        replicas = await self._replicas_of(request, context)
        cleared = sum(r.runtime.reset_prefix_cache(request.reset_external) for r in replicas)
        log.info("prefix cache reset on %d replicas: %d blocks forgotten", len(replicas), cleared)
        if self.metrics is not None:
            self.metrics.touch()
        return pb.ResetPrefixCacheResponse(blocks_cleared=cleared)
