"""The checks: each one signal a router or autoscaler reads, asked of the server the way
that reader asks it, and judged PASS, FAIL or SKIP with a one-line reason naming what was
found or what was missing.

A required check that fails makes the server non-conformant. Optional checks are the
signals a real vLLM serves only in some setups (`/kv_event_sources` is the lab's and
vllm-router's discovery route; `/is_sleeping` is a dev-mode route): their failure is
reported and does not fail the run. SKIP is for a signal that does not apply (no LoRA
adapter served, KV events off, KV offloading off).

The checks know the wire shapes (vLLM's metric names and labels, OpenAI's bodies and SSE,
vllm-router's fields), not how any server builds them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from inference_lab.conformance.probe import Probe, Reply, Unreachable

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"


@dataclass(frozen=True, slots=True)
class Result:
    name: str
    status: str      # PASS | FAIL | SKIP
    reason: str      # one line: what was found, or what was missing
    required: bool   # a FAIL here fails the run


class Failed(Exception):
    """The check's signal is missing or malformed: the message says which, in one line."""


class Skipped(Exception):
    """The check does not apply to this server: the message says why."""


@dataclass(slots=True)
class Context:
    """What the checks share: the probe, the model under test, and answers read once."""

    probe: Probe
    model: str | None
    kv_wait: float
    adapters: list[str] = field(default_factory=list)
    _metrics: dict | None = None
    _metrics_error: str | None = None
    server_info: dict | None = None
    sources: dict | None = None

    def need_model(self) -> str:
        if not self.model:
            raise Skipped("no model: /v1/models listed none and --model was not given")
        return self.model

    def metrics(self) -> dict:
        """The families of /metrics by name, parsed by prometheus_client (read once)."""
        if self._metrics is None and self._metrics_error is None:
            reply = self.probe.get("/metrics")
            if reply.status != 200:
                self._metrics_error = f"/metrics: HTTP {reply.status}"
            else:
                from prometheus_client.parser import text_string_to_metric_families

                try:
                    self._metrics = {f.name: f for f in
                                     text_string_to_metric_families(reply.body.decode("utf-8", "replace"))}
                except ValueError as exc:
                    self._metrics_error = f"/metrics does not parse as Prometheus text: {exc}"
        if self._metrics_error:
            raise Failed(self._metrics_error)
        return self._metrics

    def chat_body(self, content: str = "Say hello.", max_tokens: int = 4, **extra) -> dict:
        return {"model": self.need_model(), "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": content}], **extra}


Check = Callable[[Context], str]
CHECKS: list[tuple[str, bool, Check]] = []


def check(name: str, required: bool = True):
    def add(fn: Check) -> Check:
        CHECKS.append((name, required, fn))
        return fn
    return add


def _json_of(reply: Reply, route: str):
    if reply.status != 200:
        raise Failed(f"{route}: HTTP {reply.status}")
    body = reply.json()
    if body is None:
        raise Failed(f"{route}: the answer is not JSON ({reply.content_type or 'no content type'})")
    return body


def _fields(obj, route: str, names: dict[str, type | tuple]) -> None:
    """Every named field present with its type, else one Failed naming all that are not."""
    if not isinstance(obj, dict):
        raise Failed(f"{route}: expected a JSON object, got {type(obj).__name__}")
    missing = [n for n in names if n not in obj]
    if missing:
        raise Failed(f"{route}: no {', '.join(missing)}")
    wrong = [f"{n} ({type(obj[n]).__name__})" for n, t in names.items()
             if not isinstance(obj[n], t) or isinstance(obj[n], bool) and t in (int, (int, float))]
    if wrong:
        raise Failed(f"{route}: wrong type of {', '.join(wrong)}")


def _usage(usage, route: str) -> str:
    if not isinstance(usage, dict):
        raise Failed(f"{route}: no usage")
    _fields(usage, f"{route} usage", {"prompt_tokens": int, "completion_tokens": int, "total_tokens": int})
    p, c, t = usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]
    if p < 1 or c < 1 or t != p + c:
        raise Failed(f"{route} usage: prompt {p} + completion {c} != total {t}")
    return f"usage {p} + {c} = {t}"


# -- the model list: run first, it finds the model and the adapters ------------------

@check("/v1/models")
def models(ctx: Context) -> str:
    """Run first: it finds the model (the first entry unless --model) and the adapters."""
    body = _json_of(ctx.probe.get("/v1/models"), "/v1/models")
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data):
        raise Failed("/v1/models: no list of models with an id under data")
    ids = [m["id"] for m in data]
    ctx.adapters = [m["id"] for m in data if m.get("parent")]
    if ctx.model is None:
        ctx.model = ids[0] if ids else None
        if ctx.model is None:
            raise Failed("/v1/models: no model listed")
    elif ctx.model not in ids:
        raise Failed(f"/v1/models does not list {ctx.model!r} (it lists {', '.join(ids) or 'none'})")
    return f"{len(ids)} listed; checking {ctx.model!r}"



# -- the model-server protocol metrics (GAIE's endpoint picker, llm-d) ------------------

def _gauge(ctx: Context, name: str, labels: tuple[str, ...], of_model: bool = True) -> list:
    families = ctx.metrics()
    family = families.get(name)
    if family is None:
        raise Failed(f"{name} missing from /metrics")
    if family.type != "gauge":
        raise Failed(f"{name} is a {family.type}, not a gauge")
    samples = [s for s in family.samples if s.name == name]
    if not samples:
        raise Failed(f"{name} has no sample")
    missing = sorted({label for s in samples for label in labels if label not in s.labels})
    if missing:
        raise Failed(f"{name} has no label {', '.join(missing)}")
    if of_model and ctx.model and not any(s.labels["model_name"] == ctx.model for s in samples):
        raise Failed(f"{name} has no sample with model_name={ctx.model!r}")
    return samples


@check("metrics: queue gauges")
def queue_gauges(ctx: Context) -> str:
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running"):
        _gauge(ctx, name, ("model_name", "engine"))
    return "vllm:num_requests_waiting and vllm:num_requests_running, gauges with model_name, engine"


@check("metrics: KV-cache usage")
def kv_usage(ctx: Context) -> str:
    samples = _gauge(ctx, "vllm:kv_cache_usage_perc", ("model_name", "engine"))
    if not all(0.0 <= s.value <= 1.0 for s in samples):
        raise Failed("vllm:kv_cache_usage_perc outside 0..1 (a fraction, as vLLM's)")
    return "vllm:kv_cache_usage_perc, a gauge with model_name, engine, in 0..1"


@check("metrics: cache config")
def cache_config(ctx: Context) -> str:
    samples = _gauge(ctx, "vllm:cache_config_info", ("block_size", "num_gpu_blocks"), of_model=False)
    sample = samples[0].labels
    if not (sample["block_size"].isdigit() and sample["num_gpu_blocks"].isdigit()):
        raise Failed("vllm:cache_config_info's block_size or num_gpu_blocks is not a whole number")
    return f"vllm:cache_config_info block_size={sample['block_size']} num_gpu_blocks={sample['num_gpu_blocks']}"


@check("metrics: LoRA")
def lora_info(ctx: Context) -> str:
    if not ctx.adapters:
        try:
            present = "vllm:lora_requests_info" in ctx.metrics()
        except Failed:
            present = False
        if not present:
            raise Skipped("no LoRA adapter in /v1/models (and no vllm:lora_requests_info)")
    _gauge(ctx, "vllm:lora_requests_info",
           ("max_lora", "running_lora_adapters", "waiting_lora_adapters"), of_model=False)
    n = len(ctx.adapters)
    served = f" ({n} adapter{'s' if n != 1 else ''} served)" if n else ""
    return "vllm:lora_requests_info with max_lora, running_lora_adapters, waiting_lora_adapters" + served


# -- the OpenAI routes ------------------------------------------------------------------

@check("chat completion")
def chat(ctx: Context) -> str:
    route = "/v1/chat/completions"
    body = _json_of(ctx.probe.post(route, ctx.chat_body()), route)
    if not isinstance(body, dict) or body.get("object") != "chat.completion":
        raise Failed(f"{route}: object is not chat.completion")
    choices = body.get("choices")
    if not (isinstance(choices, list) and choices and isinstance(choices[0].get("message"), dict)):
        raise Failed(f"{route}: no choices[0].message")
    return _usage(body.get("usage"), route)


@check("chat completion, streamed")
def chat_stream(ctx: Context) -> str:
    route = "/v1/chat/completions (stream)"
    status, ctype, lines = ctx.probe.stream(
        "/v1/chat/completions", ctx.chat_body(stream=True, stream_options={"include_usage": True}))
    if status != 200:
        raise Failed(f"{route}: HTTP {status}")
    if not ctype.startswith("text/event-stream"):
        raise Failed(f"{route}: content type {ctype or 'none'}, not text/event-stream")
    chunks, done, usage = 0, False, None
    for line in lines:
        if not line or line.startswith(":"):
            continue
        if not line.startswith("data: "):
            raise Failed(f"{route}: a line that is not an SSE data line: {line[:40]!r}")
        if done:
            raise Failed(f"{route}: data after [DONE]")
        data = line[len("data: "):]
        if data == "[DONE]":
            done = True
            continue
        try:
            chunk = json.loads(data)
        except ValueError:
            raise Failed(f"{route}: an event that is not JSON: {data[:40]!r}") from None
        if not isinstance(chunk, dict) or chunk.get("object") != "chat.completion.chunk":
            raise Failed(f"{route}: an event whose object is not chat.completion.chunk")
        chunks += 1
        if chunk.get("usage"):
            usage = chunk["usage"]
    if not done:
        raise Failed(f"{route}: no data: [DONE] at the end")
    if usage is None:
        raise Failed(f"{route}: no usage chunk with stream_options.include_usage")
    return f"{chunks} chunks then [DONE]; " + _usage(usage, route)


# -- what routers read: load, server info, KV-event sources, render ---------------------

@check("load: /load or /get_load")
def load(ctx: Context) -> str:
    found, missing = [], []
    for route, key in (("/load", "server_load"), ("/get_load", "load")):
        reply = ctx.probe.get(route)
        body = reply.json() if reply.status == 200 else None
        if isinstance(body, dict) and isinstance(body.get(key), int) and not isinstance(body[key], bool):
            found.append(f"{route} {{{key!r}: {body[key]}}}".replace("'", '"'))
        else:
            missing.append(f"{route} (HTTP {reply.status})" if reply.status != 200
                           else f"{route} (no integer {key})")
    if not found:
        raise Failed("neither load route: " + ", ".join(missing))
    return "; ".join(found)


@check("/get_server_info")
def server_info(ctx: Context) -> str:
    route = "/get_server_info"
    body = _json_of(ctx.probe.get(route), route)
    _fields(body, route, {"model_id": str, "kv_block_size": int, "data_parallel_rank": int})
    if body["kv_block_size"] < 1 or body["data_parallel_rank"] < 0:
        raise Failed(f"{route}: kv_block_size below 1 or a negative data_parallel_rank")
    ctx.server_info = body
    return (f"model_id {body['model_id']}, kv_block_size {body['kv_block_size']}, "
            f"data_parallel_rank {body['data_parallel_rank']}")


@check("render API")
def render(ctx: Context) -> str:
    route = "/v1/chat/completions/render"
    body = _json_of(ctx.probe.post(route, ctx.chat_body()), route)
    if isinstance(body, list) and len(body) == 1:
        body = body[0]
    if not isinstance(body, dict) or not isinstance(body.get("token_ids"), list) or not body["token_ids"] \
            or not all(isinstance(t, int) for t in body["token_ids"]):
        raise Failed(f"{route}: no token_ids (a non-empty list of integers)")
    return f"{len(body['token_ids'])} token_ids"


@check("X-data-parallel-rank")
def dp_rank_header(ctx: Context) -> str:
    route = "/v1/chat/completions"
    reply = ctx.probe.post(route, ctx.chat_body(max_tokens=1), headers={"X-data-parallel-rank": "0"})
    if reply.status != 200:
        raise Failed(f"{route} with X-data-parallel-rank: 0: HTTP {reply.status}")
    return "rank 0 answers 200"


@check("/kv_event_sources", required=False)
def kv_event_sources(ctx: Context) -> str:
    route = "/kv_event_sources"
    body = _json_of(ctx.probe.get(route), route)
    if not isinstance(body, dict):
        raise Failed(f"{route}: expected a JSON object keyed by data-parallel rank")
    for rank, source in body.items():
        if not rank.isdigit():
            raise Failed(f"{route}: key {rank!r} is not a data-parallel rank")
        _fields(source, f"{route}[{rank}]", {"endpoint": str, "topic": str})
    ctx.sources = body
    return f"ranks {', '.join(body)}" if body else "{} (KV events off)"


@check("KV events over ZMQ", required=False)
def kv_events(ctx: Context) -> str:
    if not ctx.sources:
        raise Skipped("no KV-event source: /kv_event_sources " +
                      ("is {} (events off)" if ctx.sources == {} else "did not answer"))
    from inference_lab.conformance.kv_events import one_block_stored

    rank, source = list(ctx.sources.items())[-1]  # (several ranks: the last, not rank 0)
    block = (ctx.server_info or {}).get("kv_block_size") or 16
    # A prompt no cache holds yet (the nonce first), three blocks long or more.
    prompt = f"conformance {uuid.uuid4().hex}. " + "The quick brown fox jumps over the lazy dog. " * (block // 2 + 4)

    def send() -> None:  # on the rank whose publisher is watched (several ranks: one port)
        ctx.probe.post("/v1/chat/completions", ctx.chat_body(prompt, max_tokens=1),
                       {"X-data-parallel-rank": rank} if len(ctx.sources) > 1 else None)

    return one_block_stored(source, int(rank), ctx.probe.host, send, ctx.kv_wait)


# -- sleep mode and the offload tier ----------------------------------------------------

@check("sleep mode: /is_sleeping", required=False)
def sleep_mode(ctx: Context) -> str:
    route = "/is_sleeping"
    reply = ctx.probe.get(route)
    if reply.status == 404:
        raise Failed(f"{route}: HTTP 404 (vLLM serves it with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1)")
    body = _json_of(reply, route)
    _fields(body, route, {"is_sleeping": bool})
    return f"is_sleeping {str(body['is_sleeping']).lower()}"


# vLLM's OffloadingConnector series (counters as prometheus_client's parser names their
# families, without `_total`): the transfer bytes and times a dashboard of the tier reads.
OFFLOAD_SERIES = ("vllm:kv_offload_load_bytes", "vllm:kv_offload_store_bytes",
                  "vllm:kv_offload_load_time", "vllm:kv_offload_store_time")
_OFF = (None, "", "None", "none", "null", "0", "0.0")  # an unset kv_offloading_size


@check("offload tier", required=False)
def offload(ctx: Context) -> str:
    """vLLM's `--kv-offloading-size` as a router or dashboard sees it: the size in
    `vllm:cache_config_info`, the `vllm:kv_offload_*` transfer series, and the host tier's
    capacity in `vllm:kv_offload_config_info` when the server has it. SKIP when the size
    label says offload is off and no offload series is served."""
    families = ctx.metrics()
    config = families.get("vllm:cache_config_info")
    labels = config.samples[0].labels if config is not None and config.samples else {}
    size = labels.get("kv_offloading_size")
    present = [n for n in OFFLOAD_SERIES if n in families]
    if size in _OFF and not present:
        said = "no kv_offloading_size label" if size is None else f"kv_offloading_size={size!r}"
        raise Skipped(f"offload off: vllm:cache_config_info has {said} and /metrics no vllm:kv_offload_* series")
    missing = [n for n in OFFLOAD_SERIES if n not in families]
    if missing:
        raise Failed(f"offload on (kv_offloading_size={size}) but no {', '.join(missing)} in /metrics")
    wrong = [n for n in OFFLOAD_SERIES if families[n].type != "counter"]
    if wrong:
        raise Failed(f"{', '.join(wrong)} not counters")
    found = [f"kv_offloading_size={size}" if size not in _OFF
             else "vllm:cache_config_info has no kv_offloading_size"]
    backend = labels.get("kv_offloading_backend")
    if backend and backend not in _OFF:
        found.append(f"backend {backend}")
    info = families.get("vllm:kv_offload_config_info")
    if info is not None and info.samples:
        chunks = info.samples[0].labels.get("cpu_num_chunks")
        if chunks is not None and not chunks.isdigit():
            raise Failed(f"vllm:kv_offload_config_info cpu_num_chunks={chunks!r} is not a whole number")
        if chunks is not None:
            found.append(f"{chunks} host chunks")
    moved = {n: sum(s.value for s in families[n].samples if s.name.endswith("_total"))
             for n in OFFLOAD_SERIES[:2]}
    found.append(f"{len(OFFLOAD_SERIES)} vllm:kv_offload_* counters "
                 f"({moved[OFFLOAD_SERIES[0]]:.0f} B loaded, {moved[OFFLOAD_SERIES[1]]:.0f} B stored)")
    return "; ".join(found)


def run_checks(probe: Probe, model: str | None = None, kv_wait: float = 5.0) -> tuple[str | None, list[Result]]:
    """Every check in order: (the model checked, the results). The first request
    (/v1/models) raises `Unreachable` when the server does not answer at all; a later
    request that gets no answer fails its own check."""
    ctx = Context(probe, model, kv_wait)
    results = []
    for i, (name, required, fn) in enumerate(CHECKS):
        try:
            status, reason = PASS, fn(ctx)
        except Failed as exc:
            status, reason = FAIL, str(exc)
        except Skipped as exc:
            status, reason = SKIP, str(exc)
        except Unreachable as exc:
            if i == 0:
                raise
            status, reason = FAIL, f"no answer: {exc}"
        results.append(Result(name, status, reason, required))
    return ctx.model, results
