"""The load generator as a P/D router (a scenario's `[fleet] kv_roles`): what vllm-router's
P/D mode does for each request, over the runner's connections.

1. The prefill: the request with `max_tokens: 1`, not streamed, and
   `kv_transfer_params: {"do_remote_decode": true}`, to a prefill replica (`kv_producer`).
2. The decode: the original request (streamed, with usage) carrying the prefill's returned
   `kv_transfer_params`, to a decode replica (`kv_consumer`). A prefill answer without
   them (a replica that gave no handoff) sends the decode without: it computes the prompt.

Each pool's pick is `least_loaded` (the fewest of this client's requests in flight on the
replica, the lowest index on a tie) or `round_robin`. The request's record is the decode
stream's, with its times from the prefill's send: TTFT is the first send to the decode
stream's first token, as a client behind the router sees it; `prefill_replica`,
`prefill_done` and `prefill_modelled` say where and when its prefill ended and the
prefill replica's modelled timings. A prefill that fails is the
request's result (status, error), recorded on the prefill replica.

At the end the runner reads each decode replica's /metrics: the positions received by
transfer (`vllm:external_prefix_cache_hits_total`), the prompt positions queried, and the
prompts recomputed (`inference_lab_kv_transfer_recomputed_total`).

Knows the kv_transfer_params protocol and the request bytes' JSON. Does not know the
scenario's load or the controllers.
"""

from __future__ import annotations

import json
import re

from inference_lab.common.pd_pick import PoolPicker
from inference_lab.common.prometheus_text import model_sums
from inference_lab.experiments.client import ConnectionError_, Result, monotonic

__all__ = ["PdRouter", "pd_bodies", "decode_metrics", "ratio_name"]

STATUS_NO_RESPONSE = -1
DECODE_METRICS = {
    "vllm:external_prefix_cache_hits_total": "external_hits",
    "vllm:external_prefix_cache_queries_total": "external_queries",
    "inference_lab_kv_transfer_recomputed_total": "recomputed",
}


def ratio_name(ratio: tuple[int, int]) -> str:
    return f"{ratio[0]}:{ratio[1]}"


def _with_body(head: bytes, body: dict) -> bytes:
    raw = json.dumps(body, separators=(",", ":")).encode()
    head = re.sub(rb"(?i)content-length: \d+", b"Content-Length: %d" % len(raw), head)
    return head + b"\r\n\r\n" + raw


def pd_bodies(raw: bytes) -> tuple[bytes, dict, bytes]:
    """(the prefill's request bytes, the decode's body as a dict, the head) of one
    streaming /v1/completions request's bytes."""
    head, _, body = raw.partition(b"\r\n\r\n")
    request = json.loads(body)
    prefill = {k: v for k, v in request.items() if k != "stream_options"}
    prefill.update(max_tokens=1, stream=False, kv_transfer_params={"do_remote_decode": True})
    return _with_body(head, prefill), request, head


def decode_metrics(text: str, model: str) -> dict[str, float]:
    """The decode side's transfer counters of `model` from a Prometheus exposition."""
    sums = model_sums(text, DECODE_METRICS, model)
    return {key: sums.get(name, 0.0) for name, key in DECODE_METRICS.items()}


class PdRouter:
    """The two pools (experiments.fleet.Route each), the pick in each, and one request's
    two hops."""

    def __init__(self, prefill: list, decode: list, policy: str = "least_loaded") -> None:
        if not prefill or not decode:
            raise ValueError("a P/D fleet needs a prefill and a decode replica")
        self.prefill, self.decode, self.policy = prefill, decode, policy
        self.inflight: dict[int, int] = {r.index: 0 for r in (*prefill, *decode)}
        self._pickers = {"prefill": PoolPicker([r.index for r in prefill], policy),
                         "decode": PoolPicker([r.index for r in decode], policy)}

    def pick(self, pool: str):
        """The route of the pool's replica the next request goes to (least loaded: the
        fewest of this client's requests in flight on it)."""
        routes = self.prefill if pool == "prefill" else self.decode
        return routes[self._pickers[pool].pick(lambda i: self.inflight[routes[i].index])]

    async def _hop(self, route, raw: bytes) -> Result:
        """One request on an idle keep-alive connection of `route` (or a new one, kept)."""
        self.inflight[route.index] += 1
        conn = None
        try:
            while route.idle:
                conn = route.idle.pop()
                if not conn.closed:
                    break
                conn = None
            if conn is None:
                conn = await route.endpoint.connect()
            result = await conn.send(raw)
        except (OSError, ConnectionError_) as exc:
            now = monotonic()
            if conn is not None:
                conn.close()
            return Result(STATUS_NO_RESPONSE, now, 0.0, now, error=str(exc)[:300])
        finally:
            self.inflight[route.index] -= 1
        if not conn.closed:
            route.idle.append(conn)
        return result

    async def send(self, raw: bytes) -> Result:
        """The prefill, then the decode; the decode's result with the request's first send
        as its `sent` (a failed prefill's result when it fails)."""
        prefill_raw, request, head = pd_bodies(raw)
        p_route = self.pick("prefill")
        first = await self._hop(p_route, prefill_raw)
        sent = first.sent
        if first.status != 200:
            first.replica = first.prefill_replica = p_route.index
            return first
        try:
            params = json.loads(first.body).get("kv_transfer_params")
        except (ValueError, AttributeError):
            params = None
        if params is not None:
            request["kv_transfer_params"] = params
        d_route = self.pick("decode")
        result = await self._hop(d_route, _with_body(head, request))
        result.sent = sent
        result.replica = d_route.index
        result.prefill_replica = p_route.index
        result.prefill_done = first.done
        result.prefill_modelled = first.modelled
        if params is None and result.status == 200 and not result.error:
            result.error = "no kv_transfer_params in the prefill's answer"
        return result
