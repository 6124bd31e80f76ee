"""kv_transfer_params at the gateway (in-process, fake engine): vLLM takes an object and
refuses anything else with a 400; a key of the wrong type is a 400 naming it; the
replica's role shows on /get_server_info."""

from __future__ import annotations

import pytest

from inference_lab.testing.fake_engine import FAKE_MODEL

CHAT = {"model": FAKE_MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": FAKE_MODEL, "max_tokens": 2, "prompt": "hi"}


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", CHAT),
                                        ("/v1/completions", COMPLETION)])
@pytest.mark.parametrize("params, where", [
    ("do_remote_decode", "`$.kv_transfer_params`"),
    ([1, 2], "`$.kv_transfer_params`"),
    ({"do_remote_prefill": "yes"}, "`$.kv_transfer_params.do_remote_prefill`"),
    ({"remote_block_ids": [1, "2"]}, "`$.kv_transfer_params.remote_block_ids[1]`"),
    ({"remote_port": 70000}, "`$.kv_transfer_params.remote_port`"),
    ({"remote_engine_id": 7}, "`$.kv_transfer_params.remote_engine_id`"),
    # KV offloading's per-request caps: non-negative integers
    ({"max_load_tokens": -1}, "`$.kv_transfer_params.max_load_tokens`"),
    ({"max_load_tokens": 1.5}, "`$.kv_transfer_params.max_load_tokens`"),
    ({"max_offload_tokens": "64"}, "`$.kv_transfer_params.max_offload_tokens`"),
    ({"max_offload_tokens": True}, "`$.kv_transfer_params.max_offload_tokens`"),
])
async def test_malformed_kv_transfer_params_are_a_400_naming_the_field(client, path, body,
                                                                       params, where):
    resp = await client.post(path, json={**body, "kv_transfer_params": params})
    error = (await resp.json())["error"]
    assert resp.status == 400, error
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_request")
    assert error["message"].endswith(where)


async def test_well_formed_params_and_null_are_taken(client):
    for params in (None, {}, {"do_remote_decode": True, "unknown_key": [1]},
                   {"max_load_tokens": 0, "max_offload_tokens": 2**40}):
        resp = await client.post("/v1/chat/completions", json={**CHAT, "kv_transfer_params": params})
        assert resp.status == 200, await resp.text()


async def test_server_info_names_no_kv_connector_for_a_replica_without_a_kv_role(client):
    info = await (await client.get("/get_server_info")).json()
    assert info["kv_transfer_config"] is None  # (the fake engine's replicas have no role)
