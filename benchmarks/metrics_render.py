"""What one scrape of the engine's vLLM-compatible metrics costs, without sockets.

    python benchmarks/metrics_render.py [--models 1] [--repeat 200] [--json FILE]

Drives the real simulation core through a 24-stream run of gpt-oss-20b (so every series
has observations), then times a scrape's render: the exposition the engine serves
(text rendered once by prometheus-client, numbers filled in per scrape) against
prometheus-client's `generate_latest` of the same families, and a scrape of an unchanged
model (served from cache). Prints lines and bytes per scrape and milliseconds per render.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

from prometheus_client import generate_latest  # noqa: E402

from inference_lab.engine.metrics.exposition import MetricsRegistry, _Collect  # noqa: E402
from inference_lab.engine.sim.config import default_deployments  # noqa: E402
from inference_lab.engine.sim.core import EngineCore  # noqa: E402


def timed(fn, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=1, help="copies of the model served")
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args()
    print(C.machine())
    C.print_load("metrics_render")
    cores = [EngineCore(default_deployments("b200", None)[0]) for _ in range(args.models)]
    metrics = MetricsRegistry(cores)
    for core in cores:
        model = metrics.for_model(core)
        for _ in range(24):
            core.submit(100, 200, 0.0)
        while core.has_work():
            result = core.step(core.clock)
            model.on_step(result)
            for req in result.finished:
                model.on_finished(req, req.num_output, req.finish_time)
    body = metrics.render()

    def changed() -> bytes:
        for m in metrics.models:
            m.version += 1  # as after any step: nothing can come from cache
        return metrics.render()

    fast = timed(changed, args.repeat)
    cached = timed(metrics.render, args.repeat)
    slow = timed(lambda: generate_latest(_Collect(metrics.models)), max(args.repeat // 10, 5))
    assert body == generate_latest(_Collect(metrics.models))
    lines = body.count(b"\n")
    print(f"{args.models} model(s): {lines} lines, {len(body) / 1024:.0f} KiB per scrape")
    print(f"render after a change: {fast:.2f} ms; unchanged (cache): {cached:.3f} ms; "
          f"prometheus-client generate_latest: {slow:.2f} ms")
    C.write_json(args.json, {"models": args.models, "lines": lines, "bytes": len(body),
                             "render_changed_ms": fast, "render_cached_ms": cached,
                             "generate_latest_ms": slow})


if __name__ == "__main__":
    main()
