"""The dashboard's routes on the real gateway app in front of the fake engine, over real
HTTP: the page is one self-contained document held to its own origin by its
Content-Security-Policy, `/` redirects to it, the feed has a row per model and replica
with the knobs and the queue, and `dashboard_page=False` (`--no-dashboard`) serves none
of them."""

from __future__ import annotations

import re

from aiohttp.test_utils import TestClient, TestServer

from inference_lab.gateway import create_app
from inference_lab.testing.poll import until


async def test_the_page_is_self_contained_and_held_to_its_origin(client):
    resp = await client.get("/dashboard")
    assert resp.status == 200 and resp.content_type == "text/html"
    page = await resp.text()
    assert not re.search(r"""(src|href)=["']?https?:""", page)  # nothing fetched elsewhere
    assert "<script src" not in page and "stylesheet" not in page  # every part inlined
    policy = resp.headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy and "unsafe-inline" not in policy.split("style-src")[0]
    assert policy.count("'sha256-") == 2  # uPlot and the page's script, by hash
    home = await client.get("/", allow_redirects=False)
    assert home.status == 302 and home.headers["Location"] == "/dashboard"


async def test_the_feed_has_a_row_per_model_and_replica_with_its_knobs_and_queue(client, fake):
    first = await (await client.get("/dashboard/feed")).json()
    (row,) = first["replicas"]
    assert row["model"] == next(iter(fake.models))
    assert (row["max_num_seqs"], row["max_waiting"], row["waiting"], row["running"]) == (256, 0, 0, 0)
    assert row["state"] == "ready" and first["poll_s"] > 0
    assert set(first["gateway"][0]) >= {"answered", "e2e_s", "inflight"}
    await client.post("/control/capacity", json={"max_num_seqs": 7})
    # a document is rebuilt at most every MIN_AGE_S: a later one shows the change
    async def newer():
        doc = await (await client.get("/dashboard/feed")).json()
        return doc if doc["t"] > first["t"] else None

    later = await until(newer, timeout=5, interval=0.05, what="a newer feed document")
    assert later["replicas"][0]["max_num_seqs"] == 7 and later["t"] > first["t"]


async def test_no_dashboard_serves_none_of_its_routes(fake):
    async with TestClient(TestServer(create_app(fake.target, dashboard_page=False))) as c:
        for path in ("/", "/dashboard", "/dashboard/feed"):
            assert (await c.get(path, allow_redirects=False)).status == 404, path
