"""The gateway's backlog and the hold it gives the engine: a generation request read whole
is marked until it is sent (or answered here); the Session tells the engine the oldest mark
(SessionActions.hold_s), at once when the first is made, and 0 with the Open that empties it.
Unit tests of gateway.backlog, then the real edge and engine over the Session lane (the
engine's own record of the holds and Opens it took, in order), and over gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import aiohttp
import pytest

from engine_helpers import running_engine
from inference_lab.engine.service.holds import Holds
from inference_lab.engine.service.rpc import EngineService
from inference_lab.gateway import create_app
from inference_lab.gateway.app import STATE
from inference_lab.gateway.backlog import Backlog
from inference_lab.gateway.server import start_gateway
from inference_lab.testing.fake_engine import FAKE_MODEL
from inference_lab.testing.poll import until

CHAT = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
REAL = {**CHAT, "model": "gpt-oss-20b"}  # (the real engine's model)


def test_the_oldest_mark_is_the_hold_and_only_its_moves_are_told():
    backlog, told = Backlog(), []
    backlog.on_change = told.append
    assert backlog.oldest() is None
    backlog.mark("a", 5.0)
    backlog.mark("b", 3.0)  # older: the hold moves back
    backlog.mark("c", 9.0)  # newer: it does not move
    backlog.mark("a", 1.0)  # "a" holds one already: the older stamp stays
    assert backlog.oldest() == 3.0 and told == [True, False] and len(backlog) == 3
    backlog.clear("a")  # not the oldest
    assert told == [True, False] and backlog.oldest() == 3.0
    backlog.clear("b")  # the oldest: the hold moves on
    assert told == [True, False, False] and backlog.oldest() == 9.0
    backlog.clear("zzz")  # holds nothing: nothing happens
    backlog.clear("c")
    assert backlog.oldest() is None and len(backlog) == 0 and told[-1] is False
    backlog.mark("d", 20.0)
    assert told[-1] is True  # empty again, so the next mark is a first one


def test_many_marks_cleared_in_any_order_keep_the_oldest_right():
    import random

    backlog = Backlog()
    stamps = {i: random.Random(i).uniform(0, 100) for i in range(500)}
    for key, stamp in stamps.items():
        backlog.mark(key, stamp)
    order = list(stamps)
    random.Random(7).shuffle(order)
    for key in order:
        assert backlog.oldest() == min(stamps.values())
        backlog.clear(key)
        del stamps[key]
    assert backlog.oldest() is None


@pytest.fixture
def recorded(monkeypatch) -> list[tuple[str, float]]:
    """The engine's record of ("hold", stamp) and ("open", tag), in the order it took them."""
    seen: list[tuple[str, float]] = []
    holds_set, session_open = Holds.set, EngineService._session_open

    def set_hold(self, sender, stamp):
        seen.append(("hold", stamp or 0.0))
        holds_set(self, sender, stamp)

    def open_(self, action, sink, touched):
        seen.append(("open", action.tag))
        session_open(self, action, sink, touched)

    monkeypatch.setattr(Holds, "set", set_hold)
    monkeypatch.setattr(EngineService, "_session_open", open_)
    return seen


@contextlib.asynccontextmanager
async def lane_lab(**engine_options):
    """The real engine and the real gateway (its edge marks requests) over the Session
    lane; yields the gateway's base URL, the engine's core and the gateway's state."""
    async with running_engine(**engine_options) as engine:
        app = create_app(f"127.0.0.1:{engine.port}")
        runner, port = await start_gateway(app, "127.0.0.1", 0)
        try:
            yield f"http://127.0.0.1:{port}", engine.runtimes[0].core, app[STATE]
        finally:
            await runner.cleanup()


@contextlib.asynccontextmanager
async def warm_lab(seen: list):
    """`lane_lab` with its Session up (one request served) and the engine's record of it
    cleared; yields the gateway's base URL and a client session."""
    async with lane_lab() as (base, _, _), aiohttp.ClientSession() as session:
        assert await chat(session, base, REAL) == 200
        seen.clear()
        yield base, session


async def chat(session: aiohttp.ClientSession, base: str, body: dict = CHAT) -> int:
    async with session.post(base + "/v1/chat/completions", json=body) as resp:
        await resp.read()
        return resp.status


@pytest.mark.fast_paths
async def test_a_request_is_held_from_its_read_until_its_open_goes_with_the_release(recorded):
    seen = recorded
    async with warm_lab(seen) as (base, session):
        before = time.monotonic()
        assert await chat(session, base, REAL) == 200
        after = time.monotonic()
    (kind, hold), opened, released = seen[:3]
    assert kind == "hold" and before <= hold <= after  # at once, before its Open
    assert opened == ("open", 2) and released == ("hold", 0.0)  # the Open's message: none held


@pytest.mark.fast_paths
async def test_requests_refused_here_or_malformed_release_the_hold_too(recorded):
    seen = recorded
    async with lane_lab(max_waiting=1, max_num_seqs=1) as (base, core, state), \
            aiohttp.ClientSession() as session:
        long = {**REAL, "max_tokens": 100_000, "stream": True}
        holders = [asyncio.ensure_future(chat(session, base, long))]  # the running place
        await until(lambda: core.num_running == 1)
        holders.append(asyncio.ensure_future(chat(session, base, long)))  # the waiting one
        await until(lambda: core.num_waiting == 1)
        await until(lambda: REAL["model"] in state.engine._session.saturated,
                    what="the gateway has the engine's \"full\"")
        seen.clear()
        refused = await chat(session, base, REAL)
        malformed = await chat(session, base, {"model": REAL["model"]})
        for holder in holders:
            holder.cancel()
    assert (refused, malformed) == (529, 400)
    # each was held while read, then released without an Open (answered by the gateway)
    assert seen[:4] == [("hold", seen[0][1]), ("hold", 0.0), ("hold", seen[2][1]), ("hold", 0.0)]
    assert seen[0][1] > 0 and seen[2][1] > seen[0][1]


@pytest.mark.fast_paths
async def test_a_body_still_on_its_way_holds_nothing_until_it_is_in(recorded):
    seen = recorded
    async with warm_lab(seen) as (base, _):
        body = json.dumps(REAL).encode()
        host, port = base.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:5])
        await writer.drain()
        # the client's slowness is what is tested (nothing on the gateway's side to await)
        await asyncio.sleep(0.2)
        assert seen == []  # a client's slowness holds no engine step
        sent = time.monotonic()
        writer.write(body[5:])
        await writer.drain()
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        writer.close()
    (kind, hold), opened, released = seen[:3]
    assert kind == "hold" and hold >= sent and opened[0] == "open" and released == ("hold", 0.0)


async def test_over_grpc_no_open_ever_leaves_behind_a_hold_it_makes_stale(fake):
    # (gRPC: the hold rides on the next message, so an Open and its release may share one)
    runner, port = await start_gateway(create_app(fake.target), "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            statuses = await asyncio.gather(*(chat(session, f"http://127.0.0.1:{port}")
                                              for _ in range(20)))
    finally:
        await runner.cleanup()
    assert statuses == [200] * 20
    await fake.opened.wait(20)
    holds = fake.holds.items
    assert not holds or holds[-1][0] == 0.0  # nothing held at the end


def test_a_shared_backlog_tells_every_session_listening():
    # one gateway, several engines (gateway.engines): each Session hears the hold move
    backlog = Backlog()
    first, second = [], []
    backlog.listen(first.append)
    backlog.listen(second.append)
    backlog.mark("a", 1.0)
    backlog.clear("a")
    assert first == second == [True, False]
