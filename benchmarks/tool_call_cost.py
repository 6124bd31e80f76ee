"""What a forced tool call costs the gateway per request, without sockets.

    python benchmarks/tool_call_cost.py [--tokens 200] [--repeat 2000] [--json FILE]

For each API (chat, Messages, Responses), a request with one tool (three required
properties) parsed by its dialect and its whole streamed reply rendered (opening, one
`tokens(0, 1)` per token, closing), with the tool forced and not: microseconds per request
(the best of five timeit rounds), and what `synthesize` of the schema alone takes. The
engine path, pacing and sockets are the same for both (benchmarks/protocol_cost.py
measures them, `--routes chat,chat-tool,...`).
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

from inference_lab.common.tokenizer import ByteTokenizer  # noqa: E402
from inference_lab.gateway.protocols import ROUTES  # noqa: E402
from inference_lab.gateway.protocols.base import Outcome  # noqa: E402
from inference_lab.gateway.toolcalls import synthesize  # noqa: E402

SCHEMA = {"type": "object", "required": ["location", "unit", "days"], "properties": {
    "location": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}}}
HELLO = [{"role": "user", "content": "Say hello."}]
# API -> (route, body with the tool, the field forcing it, its forcing value)
APIS = {
    "chat": ("/v1/chat/completions", {"messages": HELLO, "tools": [
        {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]},
        "required"),
    "messages": ("/v1/messages", {"messages": HELLO, "tools": [
        {"name": "get_weather", "input_schema": SCHEMA}]}, {"type": "any"}),
    "responses": ("/v1/responses", {"input": "Say hello.", "tools": [
        {"type": "function", "name": "get_weather", "parameters": SCHEMA}], "store": False},
        "required"),
}


def per_request_us(fn, repeat: int) -> float:
    return min(timeit.repeat(fn, number=repeat, repeat=5)) / repeat * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=2000)
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args()
    print(f"machine: {C.machine()}")
    tokenizer = ByteTokenizer()
    outcome = Outcome(10, [args.tokens])
    synth = per_request_us(lambda: synthesize(SCHEMA, '0:get_weather', ' token'), args.repeat * 10)
    print(f"synthesize: {synth:.1f} us")
    out = {"tokens": args.tokens, "synthesize_us": synth, "apis": {}}
    for api, (route, body, forcing) in APIS.items():
        dialect = ROUTES[route]
        base = {"model": "gpt-oss-20b", "stream": True, "max_tokens": args.tokens, **body}
        figures = []
        for choice in (None, forcing):
            raw = json.dumps({**base, **({"tool_choice": choice} if choice else {})}).encode()

            def run(raw=raw) -> None:
                reply = dialect.parse(raw, tokenizer).reply
                reply.opening()
                for _ in range(args.tokens):
                    reply.tokens(0, 1)
                reply.closing(outcome)

            figures.append(per_request_us(run, args.repeat))
        print(f"{api:10s} text {figures[0]:6.1f} us, forced tool call {figures[1]:6.1f} us "
              f"per request of {args.tokens} tokens (+{figures[1] - figures[0]:.1f})")
        out["apis"][api] = {"text_us": figures[0], "tool_us": figures[1]}
    C.write_json(args.json, out)


if __name__ == "__main__":
    main()
