"""What each API costs the gateway: the same paced load through every generation route.

One fresh `inference-lab serve` (gpt-oss-20b on b200); for each route in turn, N
closed-loop streaming clients (default 24; short prompt, 200 tokens per sequence) warm up
for --warmup seconds, then a --duration window is measured: delivered tokens/s (SSE events
received, less each response's fixed framing), client end-to-end p50 next to the engine's
modelled value, and the gateway's CPU-seconds per 1,000 delivered tokens. Routes:

- chat: /v1/chat/completions (the reference; 203 events for 200 tokens)
- messages: /v1/messages, Anthropic (206 events: start, block start, ping, 200 deltas,
  block stop, message delta, stop)
- responses: /v1/responses, OpenAI Responses (208 events; each delta carries its own
  sequence_number, so k tokens are k encodings instead of one `bytes * k`)
- chat-n4: /v1/chat/completions with n = 4 (4 sequences of 200 tokens; 809 events)

and, with --routes, each API's forced tool call (one tool, `tool_choice` forcing it; the
arguments grow one fragment per token, docs/protocols.md "Forced tool calls"):

- chat-tool: 204 events (the call's head, 200 fragments, the closing fragment, the final
  chunk, [DONE])
- messages-tool: 207 events (the text route's, plus the closing input_json_delta)
- responses-tool: 207 events (created, in_progress, item added, 200 deltas, the closing
  delta, arguments done, item done, completed)

No pass/fail: it prints figures.

    python benchmarks/protocol_cost.py [--clients 24] [--duration 8] [--warmup 2]
        [--routes chat,messages,responses,chat-n4,chat-tool,messages-tool,responses-tool]
"""

from __future__ import annotations

import argparse
import time

import _common as C

PROMPT = "Say hello."
SCHEMA = {"type": "object", "required": ["location", "unit", "days"], "properties": {
    "location": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}}}
CHAT_TOOL = {"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}],
             "tool_choice": "required"}
# route name -> (path, body without max_tokens, the cap's field, sequences, events per
# response besides one per token)
ROUTES = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}]},
             "max_tokens", 1, 3),
    "messages": ("/v1/messages", {"messages": [{"role": "user", "content": PROMPT}]},
                 "max_tokens", 1, 6),
    "responses": ("/v1/responses", {"input": PROMPT}, "max_output_tokens", 1, 8),
    "chat-n4": ("/v1/chat/completions", {"n": 4, "messages": [{"role": "user", "content": PROMPT}]},
                "max_tokens", 4, 9),
    "chat-tool": ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}],
                                           **CHAT_TOOL}, "max_tokens", 1, 4),
    "messages-tool": ("/v1/messages", {"messages": [{"role": "user", "content": PROMPT}],
                                       "tools": [{"name": "get_weather", "input_schema": SCHEMA}],
                                       "tool_choice": {"type": "any"}}, "max_tokens", 1, 7),
    "responses-tool": ("/v1/responses", {"input": PROMPT, "tools": [
        {"type": "function", "name": "get_weather", "parameters": SCHEMA}],
        "tool_choice": "required"}, "max_output_tokens", 1, 7),
}
DEFAULT_ROUTES = "chat,messages,responses,chat-n4"


def run_route(served, name: str, args: argparse.Namespace) -> dict:
    path, body, cap_field, n, extra = ROUTES[name]
    tokens = args.max_tokens
    t0 = time.monotonic() + 1.0
    t_warm = t0 + args.warmup
    t_end = t_warm + args.duration
    config = {"mode": "closed", "host": "127.0.0.1", "port": served.port, "path": path,
              "body": {"model": "gpt-oss-20b", "stream": True, cap_field: tokens, **body},
              "t0": t0, "t_warm": t_warm, "t_end": t_end, "t_hard": t_end + 30,
              "stagger": 0.5, "clients": args.clients}
    loadgens = C.start_loadgens([config])
    try:
        cpu, _, _, wall, results, _ = C.measure_window(
            served, loadgens, t_warm, t_end, profile=None, duration=args.duration,
            suffix=name, collect_timeout=90)
    finally:
        C.stop_all(loadgens)
    events = sum(r["win_frames"] for r in results)
    per_response = n * tokens + extra
    delivered = events * n * tokens / per_response
    records = [rec for r in results for rec in r["records"]]
    e2e_client = [rec[2] - rec[0] for rec in records]
    e2e_model = [rec[5][2] for rec in records if rec[5]]
    short = sum(1 for rec in records if rec[3] != per_response)
    return {"route": name, "requests": len(records), "short_responses": short,
            "delivered_tokens_per_s": delivered / wall,
            "e2e_client_p50": C.quantile(e2e_client, 0.5),
            "e2e_model_p50": C.quantile(e2e_model, 0.5),
            "gateway_cpu_per_1k_tokens": 1000 * cpu["gateway"] / delivered if delivered else float("nan"),
            "gateway_cores": cpu["gateway"] / wall, "others_cores": cpu["others"] / wall}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=24)
    parser.add_argument("--duration", type=float, default=8.0, help="measured window, seconds")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--routes", default=DEFAULT_ROUTES, help=f"of {','.join(ROUTES)}")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    print(f"machine: {C.machine()}")
    rows = []
    with C.serve() as served:
        for name in args.routes.split(","):
            C.print_load(f"{args.clients} clients on {name}")
            rows.append(run_route(served, name, args))
            r = rows[-1]
            print(f"  {name:10s} {r['requests']:5d} requests ({r['short_responses']} short)  "
                  f"{r['delivered_tokens_per_s']:9,.0f} tokens/s  e2e p50 client "
                  f"{r['e2e_client_p50'] * 1000:6.1f} ms / modelled {r['e2e_model_p50'] * 1000:6.1f} ms  "
                  f"gateway {r['gateway_cpu_per_1k_tokens']:.4f} CPU-s per 1,000 tokens "
                  f"({r['gateway_cores']:.2f} cores; other processes {r['others_cores']:.2f})",
                  flush=True)
    C.write_json(args.json, {"machine": C.machine(), "clients": args.clients, "results": rows})
    return rows


if __name__ == "__main__":
    main()
