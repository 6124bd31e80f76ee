"""The registry of BENCHMARKS.md's tables: each benchmark's marker name, its commands (and
their short `--quick` forms), about how long they take, and the function that reads its
rows from their JSON (_rows_serving.py, _rows_lab.py). `run_all.py` runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from _rows_lab import (
    fleet_fidelity_rows, fleet_idle_rows, fleet_scrape_rows, floor_rows, loadgen_rows,
    metrics_rows, prefix_cpu_rows, prefix_offline_rows, scenario_rows, sim_rows, time_scale_rows,
)
from _rows_serving import (
    batch_rows, burst_rows, cadence_rows, ceiling_rows, engine_stream_rows, protocol_rows,
    refusal_rows, soak_rows, stream_rows, tool_call_rows,
)
from _tables import Row

Argv = tuple[str, ...]


@dataclass(frozen=True)
class Bench:
    name: str  # the marker name in BENCHMARKS.md
    measures: str  # one line, for --list
    commands: tuple[Argv, ...]  # arguments of `python`, each run with --json FILE appended
    rows: Callable[[list[dict]], list[Row]]  # the figures, from each command's JSON in order
    quick: tuple[Argv, ...] = ()  # the same commands with short durations (default: as is)
    minutes: float = 1.0  # about how long the commands take together


def py(*args: str) -> Argv:
    return args


SIM_MODELS = (
    ("configs/deepseek-v3.toml", "b200", None),
    ("configs/deepseek-v3.toml", "h200", "calibrated"),
    ("configs/llama-3.1-8b.toml", "h100", "calibrated"),
    ("configs/qwen3.5-35b-a3b.toml", "b200", None),
)


def sim_models(requests: int) -> tuple[Argv, ...]:
    return tuple(py("benchmarks/sim_speed.py", "--config", config, "--hardware", hardware,
                    *(("--timing", timing) if timing else ()), "--requests", str(requests))
                 for config, hardware, timing in SIM_MODELS)


REGISTRY: tuple[Bench, ...] = (
    Bench("stream-24-64", "24 and 64 closed-loop streams: per-token cadence, TTFT over the model",
          (py("benchmarks/stream_fidelity.py", "--clients", "24,64", "--duration", "5",
              "--warmup", "2", "--ceiling", "0"),), stream_rows,
          (py("benchmarks/stream_fidelity.py", "--clients", "24", "--duration", "1",
              "--warmup", "0.5", "--ceiling", "0"),), minutes=0.5),
    Bench("stream-256-1024", "256 and 1,024 closed-loop streams: fidelity at the modelled rate",
          (py("benchmarks/stream_fidelity.py", "--clients", "256,1024", "--duration", "5",
              "--warmup", "2", "--ceiling", "0"),), stream_rows,
          (py("benchmarks/stream_fidelity.py", "--clients", "64", "--duration", "1",
              "--warmup", "0.5", "--ceiling", "0"),), minutes=1),
    Bench("sse-ceiling", "a bare aiohttp SSE server's events per CPU-second",
          (py("benchmarks/sse_ceiling.py"),), ceiling_rows,
          (py("benchmarks/sse_ceiling.py", "--clients", "16", "--variants", "1",
              "--repeat", "1", "--warmup", "0.5", "--duration", "1"),), minutes=1.5),
    Bench("refusal-path", "a saturated model's 529 under 2,000 requests/s, beside a bare floor",
          (py("benchmarks/refusal_path.py", "--duration", "4"),), refusal_rows,
          (py("benchmarks/refusal_path.py", "--duration", "0.5", "--rate", "200",
              "--baseline", "0.5"),), minutes=0.5),
    Bench("burst-1000", "1,000 streaming requests at once: admitted against the modelled engine",
          (py("benchmarks/burst.py", "--n", "1000", "--runs", "10"),), burst_rows,
          (py("benchmarks/burst.py", "--n", "400", "--runs", "1", "--max-tokens", "300"),),
          minutes=7),
    Bench("burst-4096", "4,096 streaming requests at once",
          (py("benchmarks/burst.py", "--n", "4096", "--runs", "5"),), burst_rows,
          (py("benchmarks/burst.py", "--n", "500", "--runs", "1", "--mode", "kept",
              "--max-tokens", "300"),), minutes=4),
    Bench("cadence-recovery", "how soon one token per write returns after a spike and a stall",
          (py("benchmarks/cadence_recovery.py"),), cadence_rows,
          (py("benchmarks/cadence_recovery.py", "--high", "32", "--low", "8",
              "--high-seconds", "2", "--low-seconds", "2", "--stall", "1"),), minutes=1.2),
    Bench("sim-speed", "the offline simulator: simulated output tokens per CPU-second",
          (py("benchmarks/sim_speed.py"),), sim_rows,
          (py("benchmarks/sim_speed.py", "--requests", "2000"),), minutes=0.3),
    Bench("sim-speed-models", "the offline simulator on MLA/MoE, calibrated and linear-attention models",
          sim_models(30000), sim_rows, sim_models(1000), minutes=0.5),
    Bench("protocol-cost", "the same paced load through every generation route",
          (py("benchmarks/protocol_cost.py", "--duration", "6", "--routes",
              "chat,chat-tool,messages,messages-tool,responses,responses-tool,chat-n4"),),
          protocol_rows,
          (py("benchmarks/protocol_cost.py", "--clients", "4", "--duration", "1", "--warmup",
              "0.5", "--routes", "chat,chat-tool"),), minutes=1.3),
    Bench("tool-call-cost", "a forced tool call's per-request gateway cost, no sockets",
          (py("benchmarks/tool_call_cost.py"),), tool_call_rows,
          (py("benchmarks/tool_call_cost.py", "--repeat", "20"),), minutes=0.3),
    Bench("completion-batches", "one completions request of N prompts against N requests",
          (py("benchmarks/completion_batches.py"),
           py("benchmarks/completion_batches.py", "--prompts", "32", "--rounds", "40")), batch_rows,
          (py("benchmarks/completion_batches.py", "--prompts", "8", "--rounds", "2"),
           py("benchmarks/completion_batches.py", "--prompts", "4", "--rounds", "2")), minutes=0.7),
    Bench("prefix-caching-offline", "modelled TTFT of a multi-turn chat with prefix caching off and on",
          (py("benchmarks/prefix_caching.py", "offline"),), prefix_offline_rows, minutes=0.2),
    Bench("prefix-caching-cpu", "the engine's CPU per request with token IDs and prefix caching",
          (py("benchmarks/prefix_caching.py", "cpu", "--seconds", "6"),), prefix_cpu_rows,
          (py("benchmarks/prefix_caching.py", "cpu", "--clients", "16", "--seconds", "1"),),
          minutes=0.5),
    Bench("metrics-render", "one scrape's render of the engine's vLLM metrics, no sockets",
          (py("benchmarks/metrics_render.py"), py("benchmarks/metrics_render.py", "--models", "5")),
          metrics_rows,
          (py("benchmarks/metrics_render.py", "--repeat", "5"),
           py("benchmarks/metrics_render.py", "--models", "2", "--repeat", "5")), minutes=0.3),
    Bench("fleet-idle", "idle replicas' engine CPU",
          (py("benchmarks/fleet.py", "idle", "--replicas", "64", "--seconds", "10"),),
          fleet_idle_rows,
          (py("benchmarks/fleet.py", "idle", "--replicas", "4", "--seconds", "1"),), minutes=0.3),
    Bench("fleet-fidelity", "8 replicas × 24 streams: client e2e against the model per replica",
          (py("benchmarks/fleet.py", "fidelity", "--replicas", "8", "--streams", "24",
              "--seconds", "15"),), fleet_fidelity_rows,
          (py("benchmarks/fleet.py", "fidelity", "--replicas", "2", "--streams", "4",
              "--seconds", "1", "--warmup", "1"),), minutes=0.5),
    Bench("fleet-scrape", "a replica's /metrics while 8 are scraped every 50 ms and 64 streams run",
          (py("benchmarks/fleet.py", "scrape", "--replicas", "8", "--streams", "64",
              "--seconds", "10", "--bare", "asyncio"),), fleet_scrape_rows,
          (py("benchmarks/fleet.py", "scrape", "--replicas", "2", "--streams", "4",
              "--seconds", "1", "--bare", "asyncio"),), minutes=0.4),
    Bench("engine-stream", "the engine alone, one stream: the Session lane against gRPC",
          (py("benchmarks/engine_stream.py", "--clients", "1", "--seconds", "5", "--mode", "lane"),
           py("benchmarks/engine_stream.py", "--clients", "1", "--seconds", "5", "--mode",
              "session")), engine_stream_rows,
          (py("benchmarks/engine_stream.py", "--clients", "1", "--seconds", "1", "--mode", "lane"),
           py("benchmarks/engine_stream.py", "--clients", "1", "--seconds", "1", "--mode",
              "session")), minutes=0.4),
    Bench("soak", "serve held at saturation for minutes: exact streams, memory",
          (py("benchmarks/soak.py", "--duration", "150", "--warmup", "15"),), soak_rows,
          (py("benchmarks/soak.py", "--duration", "6", "--warmup", "2"),), minutes=3),
    Bench("experiment-scenarios", "the shipped experiment scenarios through `experiment --serve`",
          (py("benchmarks/experiment_scenarios.py"),), scenario_rows,
          (py("benchmarks/experiment_scenarios.py", "--only", "reference", "--time-scale", "8"),),
          minutes=4.5),
    Bench("experiment-time-scale", "the reference page's experiment at time scales 1 to 8",
          tuple(py("benchmarks/experiment_scenarios.py", "--only", "reference", "--time-scale", k)
                for k in ("1", "2", "4", "8")), time_scale_rows,
          (py("benchmarks/experiment_scenarios.py", "--only", "reference", "--time-scale", "8"),),
          minutes=2.5),
    Bench("experiment-loadgen", "the experiment runner's load generator + AIMD: CPU per request",
          (py("benchmarks/experiment_loadgen.py", "--seconds", "5"),), loadgen_rows,
          (py("benchmarks/experiment_loadgen.py", "--seconds", "1", "--rate", "200"),),
          minutes=0.3),
    Bench("loadgen-floors", "what one timed request costs this machine, whatever the generator",
          (py("benchmarks/loadgen_floors.py", "--seconds", "5"),), floor_rows,
          (py("benchmarks/loadgen_floors.py", "--seconds", "1", "--rate", "200"),), minutes=0.5),
)
