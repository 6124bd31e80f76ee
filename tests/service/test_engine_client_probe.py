"""The gateway's engine client reports its Session pipe to a probe (EngineClient(probe=...)),
per message: what benchmarks/session_pipe.py measures with, instead of patching privates."""

from __future__ import annotations

import asyncio

from engine_helpers import running_engine
from inference_lab.gateway.engine_client import EngineClient, Probe


class Recorder(Probe):
    def __init__(self) -> None:
        self.opened: list[int] = []
        self.sent: list[int] = []  # tags of the Opens queued
        self.messages: list[list[int]] = []  # tags of the Opens in each outgoing message
        self.events: list[tuple[str, int]] = []  # (kind, tag) of every event received
        self.token_tags: list[int] = []

    def on_open(self, tag: int) -> None:
        self.opened.append(tag)

    def on_send(self, action) -> None:
        if action.HasField("open"):
            self.sent.append(action.open.tag)

    def on_message(self, actions) -> None:
        self.messages.append([a.open.tag for a in actions if a.HasField("open")])

    def on_batch(self, batch) -> None:
        self.events += [(e.WhichOneof("event"), e.tag) for e in batch.events]
        self.token_tags += list(batch.token_tags)


async def run_to_end(stream) -> list[str]:
    kinds: list[str] = []
    while "finished" not in kinds:
        kinds += [e.WhichOneof("event") for e in await stream.next_events()]
    return kinds


async def test_a_probe_sees_each_open_its_message_and_the_batches_that_answer_it():
    probe = Recorder()
    async with running_engine() as server:
        client = EngineClient(f"127.0.0.1:{server.port}", probe=probe)
        try:
            streams = await asyncio.gather(*(client.open("gpt-oss-20b", 16, 4) for _ in range(3)))
            await asyncio.wait_for(asyncio.gather(*(run_to_end(s) for s in streams)), 20)
        finally:
            await client.close()
    tags = sorted(s.tag for s in streams)
    assert sorted(probe.opened) == tags and sorted(probe.sent) == tags
    assert sorted(t for message in probe.messages for t in message) == tags  # each sent once
    for tag in tags:
        assert ("admitted", tag) in probe.events and ("finished", tag) in probe.events
        assert tag in probe.token_tags  # its token progress came in packed batches


async def test_without_a_probe_the_client_serves_the_same_requests():
    async with running_engine() as server:
        client = EngineClient(f"127.0.0.1:{server.port}")
        try:
            stream = await client.open("gpt-oss-20b", 16, 4)
            kinds = await asyncio.wait_for(run_to_end(stream), 20)
        finally:
            await client.close()
    assert kinds[0] == "admitted" and kinds[-1] == "finished" and stream.total == 4
