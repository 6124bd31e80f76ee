"""The control routes answer no web page: a request with an `Origin` (every cross-origin
request, and every POST a browser makes) is a 403 and its preflight is refused; a body must
be labelled `application/json` (a page can send text/plain, form data or no label without a
preflight); their responses never allow an origin. CORS on /v1/* stays open, as vLLM's is.
With only an API key set, it stands in for the control token. The real gateway app in
front of the fake engine, over real HTTP."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer

from inference_lab.gateway import create_app

PAGE = "http://page.example"
CRASH = b'{"fault": "crash"}'


async def _403(resp) -> None:
    assert resp.status == 403
    assert "Access-Control-Allow-Origin" not in resp.headers
    err = (await resp.json())["error"]
    assert (err["type"], err["code"]) == ("permission_error", "cross_origin_forbidden")


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", None])
async def test_a_control_post_not_labelled_json_is_a_415_and_changes_nothing(client, content_type):
    headers = {} if content_type is None else {"Content-Type": content_type}
    resp = await client.post("/control/faults", data=b'{"rate": 1}', headers=headers,
                             skip_auto_headers=["Content-Type"])
    assert resp.status == 415 and (await resp.json())["error"]["code"] == "unsupported_media_type"
    assert (await (await client.get("/control/faults")).json())["defaults"]["rate"] == 0.0
    resp = await client.post("/control/faults/replica", data=CRASH, headers=headers,
                             skip_auto_headers=["Content-Type"])
    assert resp.status == 415


async def test_a_control_request_from_a_web_page_is_refused_and_its_preflight_too(client, fake):
    resp = await client.post("/control/capacity", json={"max_num_seqs": 2},
                             headers={"Origin": PAGE})
    await _403(resp)
    assert next(iter(fake.models.values())).capacity.max_num_seqs == 256  # nothing changed
    await _403(await client.get("/control/capacity", headers={"Origin": PAGE}))
    await _403(await client.options("/control/faults/replica", headers={
        "Origin": PAGE, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"}))
    await _403(await client.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/a"},
                                 headers={"Origin": PAGE}))
    ok = await client.post("/control/capacity", json={"max_num_seqs": 2})  # not a browser
    assert ok.status == 200 and (await ok.json())[0]["max_num_seqs"] == 2


async def test_cors_on_the_api_stays_open_as_vllms(client):
    resp = await client.options("/v1/chat/completions", headers={
        "Origin": PAGE, "Access-Control-Request-Method": "POST"})
    assert resp.status == 200 and resp.headers["Access-Control-Allow-Origin"] == "*"
    resp = await client.get("/v1/models", headers={"Origin": PAGE})
    assert resp.status == 200 and resp.headers["Access-Control-Allow-Origin"] == "*"


async def test_with_an_api_key_alone_the_control_routes_need_it(fake):
    async with TestClient(TestServer(create_app(fake.target, api_key="sk-a"))) as client:
        resp = await client.post("/control/faults", json={"rate": 1})
        assert resp.status == 401
        assert (await resp.json())["error"]["code"] == "invalid_control_token"
        assert (await client.get("/control/capacity")).status == 401
        ok = await client.post("/control/faults", json={"rate": 0.5},
                               headers={"Authorization": "Bearer sk-a"})
        assert ok.status == 200 and (await ok.json())["defaults"]["rate"] == 0.5


@pytest.mark.parametrize("query", ["replica=%C2%B2", "replica=99999999999999", "replica=-1",
                                   "replica=1e3", "replica=%EF%BC%91", "replica=" + "9" * 400])
async def test_a_replica_query_that_is_not_an_index_is_a_400_never_a_500(client, query):
    from yarl import URL

    resp = await client.get(URL("/control/faults/replica?" + query, encoded=True))
    assert resp.status == 400
    assert "?replica" in (await resp.json())["error"]["message"]


async def test_a_model_query_too_long_is_a_400(client):
    resp = await client.get("/control/capacity", params={"model": "m" * 5000})
    assert resp.status == 400 and "?model" in (await resp.json())["error"]["message"]


async def test_the_gateways_own_page_reached_by_an_address_is_answered_and_no_other(client, fake):
    """The dashboard's knobs: a request from a page of this very origin is answered when the
    page was reached by an IP address or localhost (no DNS rebinding can give a page
    those); a page of another port, a rebound name, an opaque origin, a browser's
    `Sec-Fetch-Site: cross-site` and any preflight are still refused."""
    own = f"http://127.0.0.1:{client.server.port}"
    ok = await client.post("/control/capacity", json={"max_num_seqs": 3},
                           headers={"Origin": own, "Sec-Fetch-Site": "same-origin"})
    assert ok.status == 200 and (await ok.json())[0]["max_num_seqs"] == 3
    assert "Access-Control-Allow-Origin" not in ok.headers
    local = f"localhost:{client.server.port}"
    ok = await client.get("/control/capacity", headers={"Origin": f"http://{local}", "Host": local})
    assert ok.status == 200
    rebound = f"lab.example:{client.server.port}"  # a name that resolves to 127.0.0.1
    for headers in ({"Origin": f"http://{rebound}", "Host": rebound},
                    {"Origin": f"http://127.0.0.1:{client.server.port + 1}"},
                    {"Origin": "null"},
                    {"Origin": own, "Sec-Fetch-Site": "cross-site"}):
        await _403(await client.post("/control/capacity", json={"max_num_seqs": 1}, headers=headers))
    await _403(await client.options("/control/capacity", headers={
        "Origin": own, "Access-Control-Request-Method": "POST"}))
    assert next(iter(fake.models.values())).capacity.max_num_seqs == 3
    resp = await client.post("/control/capacity", data=b'{"max_num_seqs": 1}',  # still JSON only
                             headers={"Origin": own, "Content-Type": "text/plain"})
    assert resp.status == 415
