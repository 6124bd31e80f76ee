"""The engine's metrics as Prometheus text: the families of engine.metrics.series for
every replica's numbers (engine.metrics.updates), rendered by prometheus-client.

The text of every series (HELP, TYPE, name and labels) is rendered once by
prometheus-client; a scrape only fills in the numbers with prometheus-client's own float
formatting, and a model whose numbers have not changed since the last scrape is served
from cache (tests/core/test_metrics_exposition.py checks the bytes equal
prometheus-client's `generate_latest` of the same families). Renders may run in another
thread than the writes (an HTTP port's) and read a consistent-enough copy.
`MetricsRegistry` holds every replica's numbers of one engine process (or of the
virtual-time lab) and renders them.

Does not know: who updates the numbers, nor how the text is served (the engine's HTTP
port: engine.service.metrics_http; its gRPC: engine.service.rpc).
"""

from __future__ import annotations

import threading
import time

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from inference_lab.common.exposition import HistLines, Lines, render, split_families
from inference_lab.engine.metrics.series import CACHE_CONFIG_INFO, LIVE, LORA_INFO, METRICS
from inference_lab.engine.metrics.sglang import SglangMetrics, model_metrics, render_sglang
from inference_lab.engine.metrics.updates import ModelMetrics, Versions
from inference_lab.engine.sim.core import EngineCore

def families(models: list[ModelMetrics]):
    """The families of `models` as prometheus-client objects (what generate_latest takes)."""
    for name, spec in METRICS.items():
        members = [m for m in models if name in m.names]
        if not members:  # an optional series no model has is not shown (as vLLM)
            continue
        labels = ["model_name", "engine", *spec.labels]
        if spec.kind == "histogram":
            family = HistogramMetricFamily(name, spec.doc, labels=labels)
        elif spec.kind == "counter":
            family = CounterMetricFamily(name, spec.doc, labels=labels)
        else:
            family = GaugeMetricFamily(name, spec.doc, labels=labels)
        for m in members:
            for extra, value in m.samples(name):
                if spec.kind == "histogram":
                    counts, total = value
                    bounds = [floatToGoString(b) for b in m.hists[name].bounds] + ["+Inf"]
                    family.add_metric([*m.labels, *extra], list(zip(bounds, counts)), total)
                else:
                    family.add_metric([*m.labels, *extra], value)
        yield family
    if models:
        info = GaugeMetricFamily(CACHE_CONFIG_INFO, "Cache configuration of each engine.",
                                 labels=list(models[0].cache_config()))
        for m in models:
            info.add_metric(list(m.cache_config().values()), 1.0)
        yield info


class _Collect:
    def __init__(self, models: list[ModelMetrics]) -> None:
        self.models = models

    def collect(self):
        return families(self.models)


class _Template:
    """One model's exposition with its numbers taken out, family by family: rendered once
    by prometheus-client (common.exposition), then filled in per scrape: each histogram's
    lines kept until it changes, the whole model's kept while nothing changed."""

    def __init__(self, model: ModelMetrics) -> None:
        self.model = model
        self.shape = model.shape()
        families = split_families(generate_latest(_Collect([model])).decode())
        self.headers = [header for header, _ in families]  # HELP and TYPE lines per family
        self.names = (*model.names, CACHE_CONFIG_INFO)  # the family of each header
        self.fills: list = []  # per family: HistLines, or (name, Lines) of other samples
        for (_, prefixes), name in zip(families, model.names):
            if METRICS[name].kind == "histogram":
                self.fills.append(HistLines(model.hists[name], prefixes))
            else:
                self.fills.append((name, Lines(prefixes)))
        self.info = "".join(p + "1.0\n" for p in families[-1][1])  # cache_config_info
        self.key: tuple = ()
        self.chunks: list[str] = []

    def render(self) -> list[str]:
        """The sample lines of each family, as text."""
        m = self.model
        key = (m.version, *(read(m.core) for read in LIVE.values()))
        if key == self.key:
            return self.chunks
        chunks = []
        for fill in self.fills:
            if isinstance(fill, HistLines):
                chunks.append(fill.render())
            else:
                name, lines = fill
                chunks.append(lines.fill([value for _, value in m.samples(name)]))
        chunks.append(self.info)
        self.key, self.chunks = key, chunks
        return chunks


def lora_info(models: list[ModelMetrics]) -> bytes:
    """vLLM's vllm:lora_requests_info for the models serving LoRA adapters: one gauge per
    model whose value is the time of the scrape and whose labels carry the state, as vLLM
    reports it: max_lora, running_lora_adapters and waiting_lora_adapters (names joined
    by commas), plus the lab's model_name and engine."""
    served = [m for m in models if m.core.loras is not None]
    if not served:
        return b""
    family = GaugeMetricFamily(LORA_INFO, "Running stats on lora requests.",
                               labels=["model_name", "engine", "max_lora",
                                       "running_lora_adapters", "waiting_lora_adapters"])
    now = time.time()
    for m in served:
        running, waiting = m.core.lora_adapters_in_use()
        family.add_metric([*m.labels, str(m.core.loras.max_loras), ",".join(running),
                           ",".join(waiting)], now)
    return render([family])


class Exposition:
    """The models' metrics as Prometheus text: all of them, or the ones asked for."""

    def __init__(self, models: list[ModelMetrics]) -> None:
        self.models = models
        self._templates: dict[int, _Template] = {}
        self._lock = threading.Lock()  # renders come from the HTTP thread and the loop's pool

    def render(self, names: list[str] | None = None, engines: list[int] | None = None) -> bytes:
        """The exposition of the models called `names` on the engines (replicas) indexed
        `engines` (None or empty: all), merged family by family."""
        wanted = {str(e) for e in engines or ()}
        chosen = [m for m in list(self.models) if (not names or m.core.name in names)
                  and (not wanted or m.labels[1] in wanted)]
        if not chosen:
            return b""
        sglang = [m for m in chosen if isinstance(m, SglangMetrics)]
        if sglang:  # named as SGLang names them (engine.metrics.sglang)
            chosen = [m for m in chosen if not isinstance(m, SglangMetrics)]
            with self._lock:
                text = render_sglang(sglang)
            return text + (self.render_vllm(chosen) if chosen else b"")
        return self.render_vllm(chosen)

    def render_vllm(self, chosen: list[ModelMetrics]) -> bytes:
        with self._lock:
            templates = [self._template(m) for m in chosen]
            rendered = [t.render() for t in templates]
        out = []
        first = templates[0]
        if all(t.names == first.names for t in templates):  # the same families in each
            for i, header in enumerate(first.headers):
                out.append(header)
                out.extend(chunks[i] for chunks in rendered)
        else:  # optional series some models have: each family once, in the table's order
            placed = [dict(zip(t.names, range(len(t.names)))) for t in templates]
            for name in (*METRICS, CACHE_CONFIG_INFO):
                header = None
                for t, where, chunks in zip(templates, placed, rendered):
                    i = where.get(name)
                    if i is not None:
                        if header is None:
                            header = t.headers[i]
                            out.append(header)
                        out.append(chunks[i])
        return "".join(out).encode() + lora_info(chosen)

    def forget(self, model: ModelMetrics) -> None:
        with self._lock:
            if model in self.models:
                self.models.remove(model)
            self._templates.pop(id(model), None)

    def _template(self, model: ModelMetrics) -> _Template:
        template = self._templates.get(id(model))
        if template is None or template.shape != model.shape():
            template = self._templates[id(model)] = _Template(model)
        return template


class MetricsRegistry:
    """Every served model's metrics, one ModelMetrics per core."""

    def __init__(self, cores: list[EngineCore] = (), engine_index: int | list[int] = 0) -> None:
        """`engine_index`: the `engine` label, one for every core or one per core (a
        replica index). engine.fleet adds and removes replicas' cores live (for_replica,
        remove); their label is the replica index plus `engine_index` (when an int)."""
        indexes = engine_index if isinstance(engine_index, list) else [engine_index] * len(cores)
        self.offset = engine_index if isinstance(engine_index, int) else 0
        self.versions = Versions()  # shared by every model and replica
        self.models = [model_metrics(core, i, self.versions)
                       for core, i in zip(cores, indexes, strict=True)]
        self.exposition = Exposition(self.models)

    def for_model(self, core: EngineCore) -> ModelMetrics:
        return next(m for m in self.models if m.core is core)

    def for_replica(self, core: EngineCore, replica: int = 0) -> ModelMetrics:
        """A new replica's metrics (engine = offset + replica)."""
        model = model_metrics(core, self.offset + replica, self.versions)
        self.models.append(model)
        return model

    def remove(self, model: ModelMetrics) -> None:
        """A closed replica's series leave the exposition."""
        self.exposition.forget(model)

    def has_engines(self, engines: list[int]) -> bool:
        wanted = {str(e) for e in engines}
        return any(m.labels[1] in wanted for m in list(self.models))

    def render(self, names: list[str] | None = None, engines: list[int] | None = None) -> bytes:
        return self.exposition.render(names, engines)

    def touch(self) -> None:
        """A live gauge moved outside the update points (an admission, a capacity or
        replica change): the engine-wide version counts it, so a watch that sees the version
        unchanged knows nothing moved (engine.service.metrics_feed)."""
        self.versions.n += 1

    def replica_keys(self, engines: set[int] | None = None) -> dict[int, tuple]:
        """Per replica (engine label; only `engines` when given), what its exposition
        depends on: the version and live gauges of each of its models. An unchanged key
        renders the same series and values."""
        keys: dict[int, list] = {}
        for m in list(self.models):
            index = m.engine
            if engines is not None and index not in engines:
                continue
            keys.setdefault(index, []).append(
                (id(m), m.version, *(read(m.core) for read in LIVE.values())))
        return {index: tuple(key) for index, key in keys.items()}
