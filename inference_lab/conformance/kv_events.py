"""The KV-event check: subscribe to a source `/kv_event_sources` advertises, make the
server store new blocks, and decode one batch as vLLM's subscribers and vllm-router's
KV index decode it.

The layout checked is vLLM's (`vllm/distributed/kv_events.py`): three frames (topic, an
8-byte sequence number, a msgpack payload); the payload an array `[ts, events,
data_parallel_rank]`; each event a map tagged by `type`, a `BlockStored` carrying
`block_hashes`, `parent_block_hash`, `token_ids`, `block_size`, `lora_id`, `medium` and
`lora_name`. Only the live PUB socket is read, never the replay endpoint."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable

import msgspec

from inference_lab.common.extras import require
from inference_lab.conformance.checks import Failed

BLOCK_STORED = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium")
WILDCARDS = ("*", "0.0.0.0", "::", "[::]", "")
SUBSCRIBE_SETTLE = 0.3  # a SUB socket misses what is published before its subscription arrives


def reachable(endpoint: str, host: str) -> str:
    """The endpoint a client connects to: a wildcard bind address becomes the server's host."""
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme != "tcp":
        return endpoint
    bind, _, port = parts.netloc.rpartition(":")
    if bind in WILDCARDS:
        return f"tcp://{host if ':' not in host else f'[{host}]'}:{port}"
    return endpoint


def judge(frames: list[bytes], rank: int) -> str | None:
    """None while the batch stores no block; a description once one does; Failed when
    the batch is not in vLLM's layout."""
    if len(frames) != 3 or len(frames[1]) != 8:
        raise Failed(f"a KV-event message of {len(frames)} frames, not topic, 8-byte sequence, payload")
    try:
        batch = msgspec.msgpack.decode(frames[2])
    except msgspec.DecodeError as exc:
        raise Failed(f"a KV-event payload that is not msgpack: {exc}") from None
    if not (isinstance(batch, list) and len(batch) == 3 and isinstance(batch[0], (int, float))
            and isinstance(batch[1], list)):
        raise Failed("a KV-event batch that is not [ts, events, data_parallel_rank]")
    if batch[2] != rank:
        raise Failed(f"a KV-event batch of data_parallel_rank {batch[2]!r} from the source of rank {rank}")
    for event in batch[1]:
        if not isinstance(event, dict) or "type" not in event:
            raise Failed("a KV event that is not a map tagged by type")
        if event["type"] != "BlockStored":
            continue
        missing = [f for f in (*BLOCK_STORED, "lora_name") if f not in event]
        if missing:
            raise Failed(f"a BlockStored without {', '.join(missing)}")
        blocks, size = len(event["block_hashes"]), event["block_size"]
        if not isinstance(size, int) or len(event["token_ids"]) != blocks * size:
            raise Failed(f"a BlockStored whose token_ids are not {blocks} blocks of {size}")
        seq = int.from_bytes(frames[1], "big")
        return f"batch {seq}: BlockStored of {blocks} blocks of {size} tokens, rank {rank}, medium {event['medium']}"
    return None


def one_block_stored(source: dict, rank: int, host: str, send: Callable[[], None], wait: float) -> str:
    """Subscribe to `source`, call `send` (a request that stores new blocks), and judge
    the batches that arrive within `wait` seconds until one stores a block."""
    zmq = require("zmq", "the KV events check needs", "kv-events")

    endpoint = reachable(source["endpoint"], host)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    try:
        sub.setsockopt(zmq.SUBSCRIBE, source.get("topic", "").encode())
        sub.connect(endpoint)
        time.sleep(SUBSCRIBE_SETTLE)
        send()
        deadline = time.monotonic() + wait
        while (left := deadline - time.monotonic()) > 0:
            if not sub.poll(int(left * 1000)):
                break
            found = judge(sub.recv_multipart(), rank)
            if found:
                return found
        raise Failed(f"no BlockStored on {endpoint} within {wait:g} s of a request with a long prompt")
    finally:
        sub.close()
        ctx.term()
