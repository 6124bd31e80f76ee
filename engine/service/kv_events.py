"""KV-cache events over ZMQ in vLLM's wire format, so a KV-aware router can follow the cache.

Knows vLLM's `--kv-events-config` (a JSON object: enable_kv_cache_events, publisher,
endpoint, replay_endpoint, buffer_steps, hwm, topic) and its wire format, as vLLM's
`vllm/distributed/kv_events.py` and its subscriber example define it:

- a PUB socket sends one 3-frame message per engine step that changed the cache:
  (topic, sequence number as 8 bytes big-endian, payload);
- the payload is a msgpack array `[ts, [event, ...], data_parallel_rank]`, each event a
  map tagged by its `type` (vLLM's msgspec structs: the batch `array_like`, the events
  not): `{"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids",
  "block_size", "lora_id", "medium", "lora_name"}`, `{"type": "BlockRemoved",
  "block_hashes", "medium"}`, `{"type": "AllBlocksCleared"}` (block hashes are unsigned
  64-bit integers, vLLM's `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES` form; medium "GPU";
  an adapter's blocks carry its `lora_id` and `lora_name`; with KV offloading the
  host tier's chunks are "CPU" and the disk tier's "STORAGE", in vLLM's placeholder
  payload: one event per chunk, the hash of its last GPU block, no parent, no token IDs,
  block_size 0, after the GPU's events of the step; the fields vLLM gives
  defaults, such as `extra_keys` and `group_idx`, are left out as its encoder leaves
  them out when unset);
- an optional ROUTER socket (`replay_endpoint`) answers a request `(b"", seq as 8 bytes
  big-endian)` with every buffered batch from that sequence number on, each as
  `(b"", seq, payload)`, then `(b"", -1 as 8 signed bytes, b"")`.

Each replica has a publisher of its own (`ReplicaPublishers`), as each data-parallel rank
of vLLM has: its own sockets, sequence numbers and replay buffer, shared by the models
served at that replica index. `data_parallel_rank` is what a vLLM server of that shape
would say: 0 for an independent replica (each is a server of its own, as `--replicas`
models them), the replica index for a data-parallel rank (`--data-parallel-size`). As
vLLM does for data-parallel ranks, index k > 0 offsets
the endpoints' TCP port by k (an `_dp<k>` suffix on ipc/inproc names), by k times a
larger stride when the publish and replay ports are too close for that
(`replica_stride`: no two replicas' ports ever meet). A replica's
publisher opens with the replica and closes once it is drained (removing the socket files
of the ipc:// endpoints it bound, which libzmq leaves behind). The topic may contain
`{model}`, replaced by the served model's name (an engine may serve several models; vLLM
serves one). Does not know the cache itself: the core records the events
(engine.sim.prefix_cache), and the service hands each step's to `publish`.

Exposure: ZMQ has no authentication here (nor in vLLM), and a BlockStored event carries
the block's token IDs, so anyone who reaches the PUB endpoint reads every prompt (with
the built-in tokenizer the IDs are the prompt's bytes), and the replay endpoint hands out
the last `buffer_steps` batches to any caller. So an endpoint beyond loopback is logged
as a warning, and the replay endpoint binds on 127.0.0.1 (its port kept) whatever host it
names unless `expose_replay` is set (the engine's --kv-events-expose-replay).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import logging
import time
from array import array
from collections import deque
from dataclasses import dataclass, fields
from typing import Callable

import msgspec

from inference_lab.common.extras import MissingExtra
from inference_lab.engine.fleet.replicas import MAX_REPLICAS
from inference_lab.engine.sim.prefix_cache import CLEARED, REMOVED, STORED

try:  # the kv-events extra: without it a config still parses, and enabling it is refused
    import zmq
    import zmq.asyncio
except ImportError:
    zmq = None


def require_zmq() -> None:
    """MissingExtra naming the kv-events extra when pyzmq is not installed."""
    if zmq is None:
        raise MissingExtra("KV events need", "zmq", "kv-events")

log = logging.getLogger(__name__)

MEDIUM_GPU = "GPU"
END_SEQ = (-1).to_bytes(8, "big", signed=True)


class KVEventsConfigError(ValueError):
    """A --kv-events-config that cannot be used (the message names the key)."""


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    """vLLM's KVEventsConfig keys (their defaults, except an endpoint on loopback)."""

    enable_kv_cache_events: bool = False
    publisher: str = "zmq"  # "zmq" | "null"
    endpoint: str = "tcp://127.0.0.1:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000  # accepted for vLLM compatibility (no queue here)
    topic: str = ""

    @property
    def enabled(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"

    @classmethod
    def parse(cls, text: str) -> "KVEventsConfig":
        """From the JSON of --kv-events-config; KVEventsConfigError names what is wrong."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise KVEventsConfigError(f"--kv-events-config is not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise KVEventsConfigError("--kv-events-config must be a JSON object")
        kinds = {"enable_kv_cache_events": bool, "publisher": str, "endpoint": str,
                 "replay_endpoint": (str, type(None)), "buffer_steps": int, "hwm": int,
                 "max_queue_size": int, "topic": str}
        assert set(kinds) == {f.name for f in fields(cls)}
        for key, value in raw.items():
            if key not in kinds:
                raise KVEventsConfigError(f"--kv-events-config: unknown key {key!r} "
                                          f"(known: {', '.join(kinds)})")
            if not isinstance(value, kinds[key]) or (kinds[key] is int and isinstance(value, bool)):
                raise KVEventsConfigError(f"--kv-events-config: {key} has the wrong type "
                                          f"({type(value).__name__}: {value!r})")
        config = cls(**raw)
        if config.publisher not in ("zmq", "null"):
            raise KVEventsConfigError(f"--kv-events-config: publisher must be 'zmq' or 'null', "
                                      f"got {config.publisher!r}")
        for key in ("buffer_steps", "hwm"):
            if getattr(config, key) < 1:
                raise KVEventsConfigError(f"--kv-events-config: {key} must be at least 1")
        for key in ("endpoint", "replay_endpoint"):
            value = getattr(config, key)
            if value is not None and not value.startswith(("tcp://", "ipc://", "inproc://")):
                raise KVEventsConfigError(f"--kv-events-config: {key} must be a tcp://, ipc:// "
                                          f"or inproc:// address, got {value!r}")
        return config


def replica_stride(config: "KVEventsConfig") -> int:
    """How far replica k + 1's TCP ports are from replica k's. 1, as vLLM offsets
    data-parallel ranks, unless the publish and replay ports are fewer than MAX_REPLICAS
    apart: then replica k's publish port would be replica k + d's replay port (vLLM's own
    5557 / 5558 collide from two ranks on), so the stride is twice their distance d,
    which no difference of replica indices times it can equal: no two replicas' ports
    ever meet, however many there are."""
    pub, replay = _tcp_port(config.endpoint), _tcp_port(config.replay_endpoint)
    if not pub or not replay or abs(replay - pub) >= MAX_REPLICAS:
        return 1
    return 2 * abs(replay - pub)


def offset_endpoint(endpoint: str | None, index: int, stride: int = 1) -> str | None:
    """Replica `index`'s endpoint: the TCP port plus index x stride (`replica_stride`), or
    an `_dp<index>` suffix on ipc/inproc names (as vLLM offsets data-parallel ranks);
    index 0 keeps it, and so does every replica of a tcp endpoint on any free port (`:0`
    or `:*`: port + index would be a fixed low port, a privileged one)."""
    if not endpoint or index == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        return f"{base}:{int(port) + index * stride}" if port.isdigit() and int(port) else endpoint
    return f"{endpoint}_dp{index}"


def bound_ports(config: "KVEventsConfig", replicas: int, engine_index: int = 0
                ) -> list[tuple[str, int]]:
    """(what, port) of every fixed TCP port the publishers of replicas 0 .. replicas - 1
    bind (a connected endpoint binds nothing here; a free port is no fixed port), for a
    start-up to check against each other and the other ports before binding any."""
    if not config.enabled:
        return []
    stride = replica_stride(config)
    out = []
    for replica in range(replicas):
        index = engine_index + replica
        for what, endpoint in (("KV event", config.endpoint), ("KV replay", config.replay_endpoint)):
            endpoint = offset_endpoint(endpoint, index, stride)
            port = _tcp_port(endpoint)
            if port and _binds(endpoint):
                out.append((f"replica {replica}'s {what} port", port))
    return out


def _tcp_port(endpoint: str | None) -> int | None:
    """The fixed port of a tcp:// endpoint (None for ipc/inproc, `:0` or `:*`)."""
    if not endpoint or not endpoint.startswith("tcp://"):
        return None
    port = endpoint.rpartition(":")[2]
    return int(port) if port.isdigit() and int(port) else None


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def on_loopback(endpoint: str) -> bool:
    """A tcp endpoint on a loopback host, or an ipc/inproc one (this machine only)."""
    if not endpoint.startswith("tcp://"):
        return True
    host = endpoint[6:].rpartition(":")[0]
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def to_loopback(endpoint: str) -> str:
    """A tcp endpoint moved to 127.0.0.1, its port kept (others as they are)."""
    if on_loopback(endpoint):
        return endpoint
    return "tcp://127.0.0.1:" + endpoint.rpartition(":")[2]


def _binds(endpoint: str) -> bool:
    """vLLM binds a wildcard or ipc/inproc endpoint and connects to others; the lab also
    binds a loopback address (it listens on 127.0.0.1 unless told otherwise)."""
    host = endpoint.split("://", 1)[1].rpartition(":")[0]
    return ("*" in endpoint or "::" in endpoint or not endpoint.startswith("tcp://")
            or host in ("127.0.0.1", "localhost", "[::1]"))


# ---- the wire types (vLLM's: the batch a msgpack array, each event a map tagged "type") --
class _Event(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(_Event):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(_Event):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(_Event):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


def wire_events(recorded: list[tuple], block_size: int,
                lora_names: Callable[[int], str | None] = lambda _: None) -> list:
    """The core's recorded events (engine.sim.prefix_cache) as wire events;
    `lora_names(id)` is the adapter name of a LoRA id (vLLM sends both)."""
    out: list = []
    for event in recorded:
        kind = event[0]
        if kind == STORED:
            if len(event) > 5:  # an offload tier's chunk (engine.sim.offload.tier): vLLM's
                # placeholder payload, its medium, block_size 0
                out.append(BlockStored(list(event[1]), None, [], event[6], None, event[5], None))
                continue
            _, hashes, parent, tokens, lora_id = event
            ids = array("I")
            ids.frombytes(tokens)
            out.append(BlockStored(list(hashes), parent, ids.tolist(), block_size, lora_id,
                                   MEDIUM_GPU, None if lora_id is None else lora_names(lora_id)))
        elif kind == REMOVED:
            out.append(BlockRemoved(list(event[1]), event[2] if len(event) > 2 else MEDIUM_GPU))
        elif kind == CLEARED:
            out.append(AllBlocksCleared())
    return out


class ZmqEventPublisher:
    """One replica's publisher: a PUB socket (and a ROUTER for replays), a sequence
    number, and the last `buffer_steps` batches for replay. `publish` runs on the event
    loop and never blocks (a PUB socket drops what a slow subscriber cannot take, beyond
    `hwm`; the replay buffer is how a subscriber recovers)."""

    def __init__(self, config: KVEventsConfig, replica: int = 0,
                 contexts: tuple[zmq.Context, zmq.asyncio.Context] | None = None,
                 expose_replay: bool = False, rank: int | None = None) -> None:
        """`contexts` (a plain and an asyncio ZMQ context) are the caller's to terminate;
        without them the publisher has its own. Without `expose_replay` the replay
        endpoint binds on loopback whatever host it names. `replica` offsets the
        endpoints; `rank` is the data_parallel_rank its batches carry (default: the
        replica index)."""
        require_zmq()
        self.config = config
        self.replica = replica
        self.rank = replica if rank is None else rank
        stride = replica_stride(config)
        self.endpoint = offset_endpoint(config.endpoint, replica, stride)
        self.replay_endpoint = offset_endpoint(config.replay_endpoint, replica, stride)
        if self.replay_endpoint is not None and not expose_replay:
            self.replay_endpoint = to_loopback(self.replay_endpoint)
        self._own_contexts = contexts is None
        # the PUB socket is written without awaiting (a plain context)
        self._ctx, self._actx = contexts or (zmq.Context(), None)
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self._pub.linger = 0
        self._bound: list[tuple[str, bool]] = []  # (endpoint as bound, named by a wildcard)
        if _binds(self.endpoint):
            self._pub.bind(self.endpoint)
            wildcard = "*" in self.endpoint
            self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
            self._bound.append((self.endpoint, wildcard))
        else:
            self._pub.connect(self.endpoint)
        self._replay = None
        if self.replay_endpoint is not None:
            if self._actx is None:
                self._actx = zmq.asyncio.Context()
            self._replay = self._actx.socket(zmq.ROUTER)
            self._replay.linger = 0
            self._replay.bind(self.replay_endpoint)
            wildcard = "*" in self.replay_endpoint
            self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
            self._bound.append((self.replay_endpoint, wildcard))
        self._encode = msgspec.msgpack.Encoder().encode
        self._seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._replay_task: asyncio.Task | None = None

    def start(self) -> None:
        if self._replay is not None:
            self._replay_task = asyncio.get_running_loop().create_task(self._serve_replays())

    def topic_for(self, model: str) -> bytes:
        return self.config.topic.replace("{model}", model).encode()

    def publish(self, model: str, recorded: list[tuple], block_size: int,
                lora_names: Callable[[int], str | None] = lambda _: None) -> None:
        """One step's events of one model as one batch (nothing when there are none)."""
        if not recorded:
            return
        batch = KVEventBatch(time.time(), wire_events(recorded, block_size, lora_names),
                             self.rank)
        payload = self._encode(batch)
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        try:
            self._pub.send_multipart((self.topic_for(model), seq.to_bytes(8, "big"), payload),
                                     flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:  # beyond the high-water mark: dropped, as PUB does
            log.warning("KV event batch %d dropped: the publisher's queue is full", seq)

    async def _serve_replays(self) -> None:
        sock = self._replay
        while True:
            frames = await sock.recv_multipart()
            if len(frames) != 3:
                log.warning("ignored a KV event replay request of %d frames", len(frames))
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    await sock.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
            await sock.send_multipart((client, b"", END_SEQ, b""))

    def close(self) -> None:
        """Closes the sockets and removes the files of the ipc:// endpoints it bound
        (libzmq leaves them on disk)."""
        if self._replay_task is not None:
            self._replay_task.cancel()
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        for endpoint, wildcard in self._bound:
            _remove_ipc_file(endpoint, wildcard)
        if self._own_contexts:
            if self._actx is not None:
                self._actx.term()
            self._ctx.term()


def _remove_ipc_file(endpoint: str, wildcard: bool) -> None:
    """The socket file of a bound ipc:// endpoint (its resolved name; for `ipc://*` libzmq
    made a directory for it, removed too)."""
    if not endpoint.startswith("ipc://"):
        return
    path = endpoint.removeprefix("ipc://")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:  # (the close goes on)
        log.warning("cannot remove the KV event socket file %s: %s", path, exc)
    if wildcard:
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(path))


class ReplicaPublishers:
    """A publisher per replica index (vLLM: one per data-parallel rank), shared by the
    models served at that index: opened by the first of them, closed with the last. The
    ZMQ contexts (and their I/O thread) are shared by all."""

    def __init__(self, config: KVEventsConfig, engine_index: int = 0,
                 expose_replay: bool = False, data_parallel: bool = False) -> None:
        require_zmq()
        self.config = config
        self.engine_index = engine_index  # added to every replica index (ports, and rank)
        # data-parallel ranks say their index; independent replicas say rank 0, as
        # independent vLLM servers do
        self.data_parallel = data_parallel
        self.expose_replay = expose_replay  # the replay endpoint beyond loopback, if it says so
        self._warned: set[str] = set()  # the warnings given (once per engine)
        self._contexts = (zmq.Context(), zmq.asyncio.Context())
        self._open: dict[int, tuple[ZmqEventPublisher, set]] = {}  # index -> (pub, users)

    def acquire(self, replica: int, user: object) -> ZmqEventPublisher:
        """Replica `replica`'s publisher (opened, and started, by its first user)."""
        entry = self._open.get(replica)
        if entry is None:
            index = self.engine_index + replica
            publisher = ZmqEventPublisher(self.config, index, self._contexts,
                                          self.expose_replay, index if self.data_parallel else 0)
            publisher.start()
            entry = self._open[replica] = (publisher, set())
            log.info("KV cache events of replica %d on %s%s", replica, publisher.endpoint,
                     f" (replay on {publisher.replay_endpoint})"
                     if publisher.replay_endpoint else "")
            self._warn(publisher)
        entry[1].add(user)
        return entry[0]

    def _warn(self, publisher: ZmqEventPublisher) -> None:
        """Once per engine: what an endpoint beyond loopback hands out, and a replay
        endpoint kept on loopback."""
        configured = self.config.replay_endpoint
        if configured is not None and not self.expose_replay and not on_loopback(configured) \
                and "replay" not in self._warned:
            self._warned.add("replay")
            log.warning("KV cache event replays on 127.0.0.1, not %s: a replay hands any "
                        "caller the recent prompts' token IDs (--kv-events-expose-replay "
                        "binds it as configured; docs/security.md)", configured)
        exposed = [e for e in (publisher.endpoint, publisher.replay_endpoint)
                   if e is not None and not on_loopback(e)]
        if exposed and "exposed" not in self._warned:
            self._warned.add("exposed")
            log.warning("KV cache events on %s, beyond loopback and without authentication: "
                        "whoever reaches it reads every prompt's token IDs (with the "
                        "built-in tokenizer, the prompt's bytes; docs/security.md)",
                        " and ".join(exposed))

    def release(self, replica: int, user: object) -> None:
        """`user` is gone (a drained replica); the last one closes the publisher."""
        entry = self._open.get(replica)
        if entry is None:
            return
        entry[1].discard(user)
        if not entry[1]:
            del self._open[replica]
            entry[0].close()

    def publisher(self, replica: int) -> ZmqEventPublisher | None:
        entry = self._open.get(replica)
        return entry[0] if entry else None

    def publishers(self) -> list[tuple[int, ZmqEventPublisher]]:
        """(replica index, its publisher) of every open one, by index."""
        return sorted((replica, entry[0]) for replica, entry in self._open.items())

    def close(self) -> None:
        for publisher, _ in self._open.values():
            publisher.close()
        self._open.clear()
        plain, asynchronous = self._contexts
        asynchronous.term()
        plain.term()
