"""The dashboard's feed: the numbers of every model's replica (or rank) now, as one small
JSON document (`GET /dashboard/feed`), built from what the gateway already holds.

Knows: where each number comes from. GetCapacity's rows (the live knobs, waiting and
running, starting / draining / sleeping), GetFaultState per replica (a stall or slowdown
in effect), the gateway's copy of each replica's engine exposition (gateway.metrics_feed:
KV-cache usage, the modelled TTFT / TPOT / inter-token / e2e / queue histograms' sum and
count, tokens generated, finishes by reason, engine refusals by reason, the stream
cadence: coalesced updates and the update interval now, the relay lag), and the gateway's
own series per replica port (answers of the generation routes by status, their durations,
the requests open in the engine). Counters and histograms are cumulative: a reader takes
differences between two documents (`t` is the gateway's monotonic clock), so the feed
holds no history and any number of readers share one document. One document is built at
most every MIN_AGE_S; readers in between get the same bytes.

Only the lines it needs are picked from an exposition (a replica's is ~150 KB, mostly
histogram buckets); those are parsed by prometheus-client's parser, and the result is
kept while the copy is the same object. The tables below name vLLM's series; an SGLang
profile's exposition is read by SGLang's names for the same signals
(common.engine_series), and the signals it does not serve stay at zero.

Does not know: HTTP routes or the page (gateway.dashboard), how the copy is kept
(gateway.metrics_feed), what the engine does with a knob.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from inference_lab.common.engine_series import ENGINES, engine_of, renamed
from inference_lab.gateway.errors import GatewayError
from inference_lab.gateway.protocols import ROUTES
from inference_lab.gateway.protocols.base import json_encode
from inference_lab.gateway.state import GatewayState

MIN_AGE_S = 0.2  # a document is rebuilt at most this often, whoever asks
ENGINE_MIN_AGE_S = 1.0  # a replica's engine series are asked for at most this often
POLL_S = 0.5  # how often the page asks (said in the document, for scripts too)

# exposition sample -> the feed's key: gauges and counters (one value per model)
SCALARS = {
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:num_preemptions_total": "preemptions",
    "inference_lab_coalesced_updates_total": "coalesced_updates",
    "inference_lab_stream_update_interval_seconds": "update_interval_s",
    "inference_lab_relay_lag_seconds": "relay_lag_s",
    "inference_lab_steps_total": "steps",
}
# histograms: [sum, count] of the modelled values
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": "ttft_s",
    "vllm:request_time_per_output_token_seconds": "tpot_s",
    "vllm:inter_token_latency_seconds": "itl_s",
    "vllm:e2e_request_latency_seconds": "e2e_s",
    "vllm:request_queue_time_seconds": "queue_s",
}
# counters by one label: {label value: count}
BY_LABEL = {
    "vllm:request_success_total": ("finished", "finished_reason"),
    "inference_lab_rejections_total": ("rejections", "reason"),
}


@dataclass(frozen=True, slots=True)
class _Names:
    """The feed's tables in one engine's names, and the line prefixes they start with."""

    scalars: dict[str, str]
    histograms: dict[str, str]
    by_label: dict[str, tuple[str, str]]
    prefixes: tuple[bytes, ...]

    @classmethod
    def of(cls, engine: str) -> "_Names":
        scalars, histograms = renamed(SCALARS, engine), renamed(HISTOGRAMS, engine)
        by_label = renamed(BY_LABEL, engine)
        prefixes = tuple(f"{name}{{".encode() for name in [
            *scalars, *by_label, *(f"{h}_{part}" for h in histograms for part in ("sum", "count"))])
        return cls(scalars, histograms, by_label, prefixes)


_NAMES = {engine: _Names.of(engine) for engine in ENGINES}


def pick(text: bytes) -> dict[str, dict]:
    """An exposition's numbers the feed shows, per model_name."""
    names = _NAMES[engine_of(text)]
    lines = [line for line in text.split(b"\n") if line.startswith(names.prefixes)]
    models: dict[str, dict] = {}
    for family in text_string_to_metric_families(b"\n".join(lines).decode() + "\n"):
        for sample in family.samples:
            labels = sample.labels
            out = models.setdefault(labels.get("model_name", ""), _empty())
            name = sample.name
            if name in names.scalars:
                out[names.scalars[name]] = sample.value
            elif name in names.by_label:
                key, label = names.by_label[name]
                out[key][labels.get(label, "")] = sample.value
            else:
                base, _, part = name.rpartition("_")
                out[names.histograms[base]][0 if part == "sum" else 1] = sample.value
    return models


def _empty() -> dict:
    return {**{key: [0.0, 0.0] for key in HISTOGRAMS.values()},
            **{key: {} for key, _ in BY_LABEL.values()}}


def gateway_numbers(state: GatewayState) -> dict:
    """A port's own series of the generation routes: answers by status, their durations
    ([sum, count]: a stream's whole length, as its client waits for it), requests open."""
    answered: dict[str, int] = {}
    for (route, status), count in list(state.metrics.requests.items()):
        if route in ROUTES:
            answered[str(status)] = answered.get(str(status), 0) + count
    total, n = 0.0, 0
    for route, hist in list(state.metrics.durations.items()):
        if route in ROUTES:
            total += hist.sum
            n += hist.n
    return {"answered": answered, "e2e_s": [total, n], "inflight": len(state.inflight)}


@dataclass(slots=True)
class Feed:
    """The document of one gateway port. `ports()` -> {replica index: (port, its app's
    state)}: every replica port of the process (the fleet's), or this app's alone."""

    state: GatewayState
    ports: Callable[[], dict[int | None, tuple[int | None, GatewayState]]]
    data_parallel: bool = False
    _body: bytes = b""
    _at: float = float("-inf")
    _building: asyncio.Future | None = None
    _parsed: dict[int, tuple[bytes, dict]] = field(default_factory=dict)
    _asked: dict[int, float] = field(default_factory=dict)  # replica -> its last GetMetrics

    async def body(self) -> bytes:
        """The current document (rebuilt when older than MIN_AGE_S; concurrent readers
        wait for one build)."""
        if time.monotonic() - self._at < MIN_AGE_S:
            return self._body
        if self._building is not None:
            return await asyncio.shield(self._building)
        self._building = asyncio.get_running_loop().create_future()
        try:
            body = json_encode(await self._build())
            self._body, self._at = body, time.monotonic()
            self._building.set_result(body)
            return body
        except BaseException as exc:
            self._building.set_exception(exc)
            self._building.exception()  # (retrieved: a lone reader's error is raised here)
            raise
        finally:
            self._building = None

    async def _build(self) -> dict:
        client = self.state.client
        rows = await client.get_capacity()
        indices = sorted({row.replica for row in rows})
        texts, faults = await asyncio.gather(
            asyncio.gather(*(self._exposition(i) for i in indices)),
            asyncio.gather(*(self._fault(i) for i in indices)))
        engine = dict(zip(indices, texts))
        fault = dict(zip(indices, faults))
        ports = self.ports()
        out = []
        for row in rows:
            port = ports.get(row.replica, (None, None))[0]
            state = ("draining" if row.draining else "starting" if row.starting
                     else "sleeping" if row.sleep_level else "ready")
            out.append({
                "model": row.model, "replica": row.replica, "port": port, "state": state,
                "sleep_level": row.sleep_level, "ready_in_s": round(row.ready_in_s, 3),
                **fault[row.replica],
                "max_num_seqs": row.max_num_seqs, "max_waiting": row.max_waiting,
                "waiting": row.waiting, "running": row.running,
                **engine[row.replica].get(row.model, _empty()),
            })
        gateway = [{"replica": index, "port": port, **gateway_numbers(state)}
                   for index, (port, state) in sorted(ports.items(), key=_index_order)]
        return {"t": round(time.monotonic(), 4), "poll_s": POLL_S,
                "data_parallel": self.data_parallel, "replicas": out, "gateway": gateway}

    async def _exposition(self, replica: int) -> dict[str, dict]:
        """The replica's series: the copy a scraper keeps pushed, when one does; else one
        GetMetrics (a render of that replica) per build, rather than starting the engine's
        push of every change for the page."""
        client = self.state.client
        text = client.replica_metrics_if_fed(replica)
        held = self._parsed.get(replica)
        if text is None and held is not None and \
                time.monotonic() - self._asked.get(replica, 0.0) < ENGINE_MIN_AGE_S:
            return held[1]  # (a render on the engine's loop at most once a second)
        if text is None:
            self._asked[replica] = time.monotonic()
            try:
                text = await client.metrics_text(engines=[replica])
            except GatewayError:
                return {}
        if held is not None and held[0] is text:
            return held[1]
        models = pick(text)
        self._parsed[replica] = (text, models)
        return models

    async def _fault(self, replica: int) -> dict:
        try:
            state = await self.state.client.fault_state(replica)
        except GatewayError:
            return {"stalled_for_s": 0.0, "slow_factor": 1.0}
        return {"stalled_for_s": round(state.stalled_for_s, 3),
                "slow_factor": state.slow_factor or 1.0}


def _index_order(item: tuple) -> tuple:
    index = item[0]
    return (index is not None, index or 0)
