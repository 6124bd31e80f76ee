"""`inference-lab conformance URL`: which of the signals routers and autoscalers read a
server provides, each PASS, FAIL or SKIP with its reason (the checks:
`inference_lab.conformance`)."""

from __future__ import annotations

import argparse
import json
import sys

from inference_lab.cli import UsageError
from inference_lab.cli.flag_types import number

HELP = """\
Check a vLLM-compatible server (the lab, or a real vLLM) for the signals routers and
autoscalers read: the model-server protocol metrics (vllm:num_requests_waiting,
vllm:num_requests_running, vllm:kv_cache_usage_perc, vllm:cache_config_info,
vllm:lora_requests_info with LoRA), /v1/models, a chat completion and a streamed one, the
load routes, /get_server_info, the render API, the X-data-parallel-rank header,
/kv_event_sources and one KV-event batch over ZMQ, sleep mode. Each check is PASS, FAIL or
SKIP with a one-line reason naming what was found or missing.

exit status: 0 when every required check passes, 1 when one fails (they are listed),
2 when the URL is bad or does not answer.

examples:
  inference-lab conformance http://localhost:8000
  inference-lab conformance http://localhost:8080 --model gpt-oss-20b --json
"""

timeout_seconds = number(float, lambda v: 0 < v <= 3600, "seconds in (0, 3600]")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("conformance", help="check a server for the signals routers and autoscalers read",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url", help="the server's base URL, e.g. http://localhost:8000")
    p.add_argument("--model", help="the model to check (default: the first /v1/models entry)")
    p.add_argument("--api-key", help="sent as Authorization: Bearer KEY on every request")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--timeout", type=timeout_seconds, default=10.0,
                   help="seconds to wait for each answer, and for a KV-event batch (default 10)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from inference_lab.conformance import FAIL, Probe, Unreachable, run_checks

    try:
        probe = Probe(args.url, args.api_key, args.timeout)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        model, results = run_checks(probe, args.model, kv_wait=args.timeout)
    except Unreachable as exc:
        raise UsageError(f"no answer from {exc}") from None
    failed = [r.name for r in results if r.required and r.status == FAIL]
    if args.json:
        print(json.dumps({"url": probe.base, "model": model, "ok": not failed, "failed": failed,
                          "checks": [{"name": r.name, "status": r.status, "required": r.required,
                                      "reason": r.reason} for r in results]}, indent=2))
    else:
        show(probe.base, model, results, failed)
    return 1 if failed else 0


def show(url: str, model: str | None, results: list, failed: list[str]) -> None:
    """A table on a terminal; one line per check otherwise (for grep and logs)."""
    verdict = (f"{len(failed)} required check{'s' if len(failed) > 1 else ''} failed: {', '.join(failed)}"
               if failed else "every required check passed")
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        colour = {"PASS": "green", "FAIL": "red", "SKIP": "yellow"}
        table = Table(title=f"{url} ({model or 'no model'})")
        for column in ("check", "result", "reason"):
            table.add_column(column)
        for r in results:
            name = r.name if r.required else f"{r.name} (optional)"
            table.add_row(name, f"[{colour[r.status]}]{r.status}[/]", r.reason)
        console = Console()
        console.print(table)
        console.print(verdict)
        return
    print(f"{url} ({model or 'no model'})")
    width = max(len(r.name) for r in results) + len(" (optional)")
    for r in results:
        name = r.name if r.required else f"{r.name} (optional)"
        print(f"{r.status}  {name:<{width}}  {r.reason}")
    print(verdict)
