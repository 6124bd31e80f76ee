"""`--engine vllm|sglang` and SGLang's `--max-queued-requests`: which serving engine the
simulation imitates (engine.sim.profiles), on `serve`, `engine` and `sim`.

Knows the flags, their checks (one line naming the flag, exit 2) and how a profile is put
on the loaded deployments; `serve` hands both to its engine child and the profile's
name to its API servers (`gateway --engine-profile`), whose refusal and routes follow it.
"""

from __future__ import annotations

import argparse

from inference_lab.cli.flag_types import number

ENGINES = ("vllm", "sglang")


def add_engine_profile_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", dest="engine_profile", choices=ENGINES, default="vllm",
                   help="the serving engine to imitate (default vllm). sglang: SGLang's "
                        "admission (remaining output x a decaying new-token ratio), prefill and "
                        "decode in separate passes, a token-granular prefix cache, its chunk "
                        "size by GPU memory, an unbounded queue, sglang:* metrics and its "
                        "routes (/get_server_info, /get_load, /v1/loads, /health_generate, "
                        "/get_model_info, /flush_cache); docs/engines.md")
    p.add_argument("--max-queued-requests", type=number(int, lambda v: v >= 1, "an integer >= 1"),
                   metavar="N",
                   help="with --engine sglang: refuse arrivals once N requests wait, with "
                        "SGLang's 503 \"The request queue is full.\" (default: unbounded)")


def check_engine_profile(args: argparse.Namespace) -> None:
    """Flags that do not go with the chosen engine: refused in one line."""
    from inference_lab.cli import UsageError

    sglang = getattr(args, "engine_profile", "vllm") == "sglang"
    if args.max_queued_requests is not None and not sglang:
        raise UsageError("--max-queued-requests: SGLang's queue bound, for --engine sglang "
                         "(vLLM's is --max-waiting)")
    if sglang and args.max_waiting:
        raise UsageError("--max-waiting: with --engine sglang the queue bound is "
                         "--max-queued-requests N")


def profiled(args: argparse.Namespace, deployments: list) -> list:
    """The deployments as the chosen engine runs them."""
    from inference_lab.engine.sim.profiles import apply

    check_engine_profile(args)
    engine = getattr(args, "engine_profile", "vllm")
    return [apply(d, engine, args.max_queued_requests) for d in deployments]


def engine_profile_argv(args: argparse.Namespace) -> list[str]:
    """The flags again, for `serve` to hand to its engine child."""
    argv = ["--engine", args.engine_profile]
    if args.max_queued_requests is not None:
        argv += ["--max-queued-requests", str(args.max_queued_requests)]
    return argv


def saturated_status(args: argparse.Namespace) -> int:
    """The refusal's status: --saturated-status when given, else the engine's own
    (529 for vllm, SGLang's 503)."""
    if args.saturated_status is not None:
        return args.saturated_status
    return 503 if getattr(args, "engine_profile", "vllm") == "sglang" else 529
