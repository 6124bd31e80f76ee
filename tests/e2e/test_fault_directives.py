"""Every fault directive mode through the real `serve` command, observed with real curl.

curl's documented exit codes: 18 (CURLE_PARTIAL_FILE: the chunked body ended without its
terminator), 56 (CURLE_RECV_ERROR: connection reset by peer), 28 (CURLE_OPERATION_TIMEDOUT:
`-m` expired while the server stalled), 0 for the modes that end the body cleanly.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from inference_lab.testing.launch import serve
from inference_lab.testing.poll import wait_until

pytestmark = pytest.mark.tools("curl")

MODEL = "gpt-oss-20b"
CHAT = {"model": MODEL, "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hello"}], "max_tokens": 64}
TEXT = {"model": MODEL, "stream": True, "prompt": "hello", "max_tokens": 64}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    configs = tmp_path_factory.mktemp("configs")
    source = Path(__file__).resolve().parents[2] / "configs" / f"{MODEL}.toml"
    (configs / f"{MODEL}.toml").write_text(source.read_text() + "\n[fault]\nretry_after_ms = 123\n")
    with serve("--enable-directives", "--config", str(configs)) as served:
        yield served


def curl(lab, directive: str, body: dict = CHAT, route: str = "chat/completions",
         max_time: float = 10.0) -> tuple[int, bytes]:
    proc = subprocess.run(
        ["curl", "-sN", "-m", str(max_time), f"{lab.base}/v1/{route}",
         "-H", "content-type: application/json", "-H", f"x-inference-lab-fault: {directive}",
         "-d", json.dumps(body)], capture_output=True, timeout=max_time + 10)
    return proc.returncode, proc.stdout


def frames(out: bytes) -> list[bytes]:
    """Complete `data:` payloads (a torn last frame is left out)."""
    parts = out.split(b"\n\n")
    return [p.removeprefix(b"data: ") for p in parts[:-1]]


def deltas(out: bytes) -> list[dict]:
    return [json.loads(f)["choices"][0]["delta"] for f in frames(out)
            if f != b"[DONE]" and json.loads(f).get("choices")]


def capacity(lab) -> dict:
    with urllib.request.urlopen(f"{lab.base}/control/capacity?model={MODEL}", timeout=5) as r:
        return json.load(r)[0]


@pytest.mark.parametrize("mode", ["cut_between_frames", "mid_reasoning", "mid_tool_call"])
def test_cuts_end_without_the_chunk_terminator(lab, mode):
    code, out = curl(lab, f"{mode};after_chunks=4;delay_ms=1")
    assert code == 18
    got = deltas(out)
    assert got[0] == {"role": "assistant"} and len(got) == 5  # role + 4 content frames
    assert out.endswith(b"\n\n") and b"[DONE]" not in out
    if mode == "mid_reasoning":
        assert all(set(d) == {"reasoning_content"} for d in got[1:])
    if mode == "mid_tool_call":
        call = got[1]["tool_calls"][0]
        assert (call["id"], call["function"]["name"]) == ("call_fault_0", "get_current_weather")
        args = "".join(d["tool_calls"][0]["function"]["arguments"] for d in got[1:])
        assert args.startswith('{"location"')
        with pytest.raises(json.JSONDecodeError):
            json.loads(args)  # never terminated


def test_cut_mid_frame_tears_the_json(lab):
    code, out = curl(lab, "cut_mid_frame;delay_ms=0")
    assert code == 18
    torn = out.split(b"\n\n")[-1]
    assert torn.startswith(b'data: {"id"') and len(deltas(out)) == 4
    with pytest.raises(json.JSONDecodeError):
        json.loads(torn.removeprefix(b"data: "))


def test_cut_mid_frame_utf8_cuts_inside_a_character(lab):
    code, out = curl(lab, "cut_mid_frame;utf8=true;delay_ms=0")
    assert code == 18
    assert out.endswith(b"caf\xc3")  # the first byte of "é" (0xC3 0xA9), not the second
    with pytest.raises(UnicodeDecodeError):
        out.decode()


def test_reset_is_a_tcp_rst(lab):
    code, out = curl(lab, "reset;after_chunks=2;delay_ms=0")
    assert code == 56
    assert len(deltas(out)) == 3


def test_stall_holds_the_connection_until_the_client_gives_up(lab):
    started = time.monotonic()
    code, out = curl(lab, "stall;after_chunks=1;delay_ms=0", max_time=1.5)
    assert code == 28 and time.monotonic() - started >= 1.4
    assert len(deltas(out)) == 2


def test_error_envelope_200_then_done(lab):
    code, out = curl(lab, "error_envelope_200;delay_ms=0")
    assert code == 0
    *_, error, done = frames(out)
    assert done == b"[DONE]"
    body = json.loads(error)["error"]
    assert body["code"] == 502 and body["message"] == "Provider returned error"


def test_error_400_in_sse_ends_cleanly_without_done(lab):
    code, out = curl(lab, "error_400_in_sse;delay_ms=0")
    assert code == 0 and b"[DONE]" not in out
    last = json.loads(frames(out)[-1])
    assert (last["object"], last["code"], last["type"]) == ("error", 400, "BadRequestError")


def test_no_done_sends_finish_and_usage_but_no_done(lab):
    code, out = curl(lab, "no_done;after_chunks=2;delay_ms=0")
    assert code == 0 and b"[DONE]" not in out
    *_, finish, usage = [json.loads(f) for f in frames(out)]
    assert finish["choices"][0]["finish_reason"] == "stop"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 2


def test_no_usage_sends_done_but_never_the_usage(lab):
    code, out = curl(lab, "no_usage;delay_ms=0")
    assert code == 0 and frames(out)[-1] == b"[DONE]"
    assert b'"usage"' not in out


def test_cancelled_499_is_dynamos_exact_body(lab):
    code, out = curl(lab, "cancelled_499;delay_ms=0")
    assert code == 0
    assert frames(out)[-1] == (
        b'{"error":{"code":499,"message":"CancelledError: ","type":"request_cancelled"}}')


def test_completions_flavor_has_no_role_frame(lab):
    code, out = curl(lab, "mid_reasoning;after_chunks=3;delay_ms=0", TEXT, "completions")
    assert code == 18
    texts = [json.loads(f)["choices"][0]["text"] for f in frames(out)]
    assert texts == ["<think>", " token", " token"]


def test_after_tokens_fires_inside_the_real_stream_and_the_engine_sees_a_disconnect(lab):
    long = {**CHAT, "max_tokens": 20_000}  # seconds of decoding if nobody cancelled it
    code, out = curl(lab, "cut_between_frames;after_tokens=7", long)
    assert code == 18
    assert "".join(d.get("content") or "" for d in deltas(out)) == " token" * 7
    row = wait_until(lambda: (r := capacity(lab))["running"] == 0 and r, timeout=5,
                     what="the cut request cancelled in the engine")
    assert row["running"] == 0 and row["waiting"] == 0  # cancelled, its KV freed


def test_after_tokens_reset_in_a_real_stream(lab):
    code, out = curl(lab, "reset;after_tokens=3", {**CHAT, "max_tokens": 20_000})
    assert code == 56
    text = "".join(d.get("content") or "" for d in deltas(out))
    assert text == " token" * 3


@pytest.mark.parametrize("directive, named", [
    ("explode", "unknown fault mode 'explode'"),
    ("stall;bogus=1", "unknown fault parameter 'bogus'"),
    ("stall;after_chunks=lots", "after_chunks must be an integer"),
    ("stall;utf8=yes", "utf8 must be true or false"),
])
def test_bad_directives_are_a_400_listing_the_valid_modes(lab, directive, named):
    code, out = curl(lab, directive)
    assert code == 0
    err = json.loads(out)["error"]
    assert err["code"] == "invalid_fault_directive" and err["type"] == "invalid_request_error"
    assert named in err["message"]
    assert "cut_between_frames" in err["message"] and "mid_tool_call" in err["message"]


def test_the_models_fault_table_gives_its_retry_hints_to_an_injected_429(lab):
    req = urllib.request.Request(f"{lab.base}/control/faults", data=json.dumps(
        {"script": [{"error": "rate_limit", "count": 1}]}).encode(),
        headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        state = json.load(resp)
    assert state["models"][MODEL]["retry_after_ms"] == 123  # from [fault] in its config
    body = json.dumps({**CHAT, "stream": False}).encode()
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(urllib.request.Request(
            f"{lab.base}/v1/chat/completions", data=body), timeout=5)
    assert exc.value.code == 429 and exc.value.headers["retry-after-ms"] == "123"
    assert json.load(exc.value)["error"]["code"] == "rate_limit_exceeded"
