"""Scenario prompts: the structure the offline simulator gives its token IDs survives as
text through the server's built-in tokenizer (one token per 4 characters, equal where the
IDs are equal), and unstructured prompts never share a first token."""

from __future__ import annotations

import json
import random

from inference_lab.common.conversations import Conversations
from inference_lab.common.tokenizer import ByteTokenizer, ids_to_bytes
from inference_lab.common.workload import LengthDist, WorkloadSpec, draw_adapter
from inference_lab.experiments.client import Endpoint
from inference_lab.experiments.prompts import Prompts, token_text


def spec(**keys) -> WorkloadSpec:
    return WorkloadSpec("closed_loop", 10**9, LengthDist("fixed", value=20),
                        LengthDist("fixed", value=10), num_concurrent_users=2, seed=7, **keys)


def test_token_text_is_one_builtin_token_per_id_and_keeps_shared_prefixes():
    convs = Conversations(100, 1, 3, seed=1)
    first = convs.next_prompt("a", 20, 10)
    second = convs.next_prompt("a", 20, 10)  # turn 2: turn 1 + its reply + a new message
    other = convs.next_prompt("b", 20, 10)  # another conversation, the same system prompt
    texts = [token_text(ids) for ids in (first, second, other)]
    tok = ByteTokenizer()
    for ids, text in zip((first, second, other), texts):
        assert text.isascii() and json.dumps(text) == f'"{text}"'  # nothing to escape
        assert len(tok.encode(text)) == len(ids) // 4 == len(text) // 4
    assert texts[1].startswith(texts[0]) and len(texts[1]) == 4 * (120 + 10 + 20)
    common = next(i for i, (x, y) in enumerate(zip(texts[0], texts[2])) if x != y)
    assert 400 <= common < 404  # exactly the 100-token system prompt is shared
    # Text keeps 24 bits of each (random 32-bit) ID: distinct low bytes, distinct text.
    ids = ids_to_bytes([1, 2, 3, 4])
    assert token_text(ids)[:12] == token_text(ids_to_bytes([1, 2, 3]))
    assert len({token_text(ids)[i:i + 4] for i in range(0, 16, 4)}) == 4


def test_prompts_follow_the_workload_keys_per_user_and_per_open_loop_conversation():
    p = Prompts(spec(shared_prefix_len=64, num_turns=2))
    a1, b1, a2, a3 = p.next(0, 20, 10), p.next(1, 20, 10), p.next(0, 20, 10), p.next(0, 20, 10)
    assert [x.tokens for x in (a1, b1, a2, a3)] == [84, 84, 114, 84]  # turn 2 = 84 + 10 + 20
    assert a2.text.startswith(a1.text) and not a3.text.startswith(a2.text[:4 * 84])
    assert a1.text[:256] == b1.text[:256] == a3.text[:256]  # the one shared system prompt
    o = [p.next(-1, 20, 10) for _ in range(4)]  # open loop: arrival i in conversation i // 2
    assert o[1].text.startswith(o[0].text) and o[3].text.startswith(o[2].text)
    assert not o[2].text.startswith(o[1].text[:4 * 84])
    assert Prompts(spec()).next(0, 20, 10).text is None  # unstructured: the client's filler


def test_a_fraction_of_requests_names_each_adapter():
    p = Prompts(spec(lora_adapters=(("sql", 0.25), ("chat", 0.5))))
    names = [p.next(0, 20, 10).adapter for _ in range(4000)]
    assert abs(names.count("sql") / 4000 - 0.25) < 0.03
    assert abs(names.count("chat") / 4000 - 0.5) < 0.03
    assert abs(names.count("") / 4000 - 0.25) < 0.03
    assert draw_adapter((("x", 1.0),), random.Random(1)) == "x"


def test_unstructured_requests_differ_in_their_first_token_only():
    ep = Endpoint("http://127.0.0.1:9", "m")
    bodies = [json.loads(ep.request(200, 5, serial).split(b"\r\n\r\n", 1)[1]) for serial in (1, 2, 2**24 + 3)]
    prompts = [b["prompt"] for b in bodies]
    assert all(len(ByteTokenizer().encode(x)) == 200 for x in prompts)
    assert prompts[0][4:] == prompts[1][4:] == prompts[2][4:]
    assert len({x[:4] for x in prompts}) == 3
    sql = json.loads(ep.request(200, 5, 1, "sql").split(b"\r\n\r\n", 1)[1])
    assert sql["model"] == "sql" and bodies[0]["model"] == "m"
    head = ep.request(200, 5, 1).split(b"\r\n\r\n", 1)
    assert f"Content-Length: {len(head[1])}".encode() in head[0]
