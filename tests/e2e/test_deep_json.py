"""JSON nested deeper than the decoder's recursion limit (here 20,000 arrays, 40 KB, well
under the body limit), in a field the lab reads or one it ignores, on every JSON route:
a 400 naming the problem in the route's envelope, never a 500 with a traceback in the log."""

from __future__ import annotations

from hardening_helpers import json_request
from inference_lab.testing.launch import serve

DEEP = "[" * 20_000 + "]" * 20_000


def test_deep_nesting_is_a_400_on_every_json_route():
    msgs = '"messages": [{"role": "user", "content": "x"}]'
    cases = [
        ("/v1/chat/completions", '{"model": "gpt-oss-20b", "max_tokens": 2, "x": %s, %s}' % (DEEP, msgs)),
        ("/v1/chat/completions", '{"model": "gpt-oss-20b", "max_tokens": 2, "tools": %s, %s}' % (DEEP, msgs)),
        ("/v1/completions", '{"model": "gpt-oss-20b", "max_tokens": 2, "prompt": "x", "x": %s}' % DEEP),
        ("/v1/messages", '{"model": "gpt-oss-20b", "max_tokens": 2, "metadata": %s, %s}' % (DEEP, msgs)),
        ("/v1/messages/count_tokens", '{"model": "gpt-oss-20b", "tools": %s, %s}' % (DEEP, msgs)),
        ("/v1/responses", '{"model": "gpt-oss-20b", "input": "x", "x": %s}' % DEEP),
        ("/tokenize", '{"prompt": "x", "x": %s}' % DEEP),
    ]
    strict = [("/control/capacity", '{"max_num_seqs": 8, "x": %s}' % DEEP),  # unknown keys:
              ("/control/faults", '{"rate": 0, "x": %s}' % DEEP)]  # refused before any depth
    with serve() as s:
        for path, body in cases:
            status, reply = json_request(s.base, "POST", path, raw=body)
            assert status == 400, (path, status, reply)
            error = reply["error"]
            assert "nested too deeply" in error["message"], (path, reply)
            if path.startswith("/v1/messages"):
                assert reply["type"] == "error" and error["type"] == "invalid_request_error"
        for path, body in strict:
            status, reply = json_request(s.base, "POST", path, raw=body)
            assert status == 400 and "unknown field" in reply["error"]["message"], (path, reply)
        # a tool result's content blocks do not nest: a nested one counts as nothing
        status, reply = json_request(s.base, "POST", "/v1/messages", body={
            "model": "gpt-oss-20b", "max_tokens": 2, "messages": [{"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t", "content": [
                    {"type": "tool_result", "content": [{"type": "text", "text": "x"}]}]}]}]})
        assert status == 200, reply
        assert "Traceback" not in s.log() and "RecursionError" not in s.log()
