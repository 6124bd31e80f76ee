"""The gateway's engines: one client per engine process, and which one a request goes to.

Knows: that a fleet's replica indices may live in several engine processes (`serve
--engine-processes P`: index i in the process of its shard; `--data-parallel-size D`: one
data-parallel rank a process), each with its own EngineClient (its own Session and
admission copy), all sharing one backlog (a request read here may go to any of them, so
every engine holds its decisions behind it); which client serves a replica index; the
calls that concern every replica (capacity, replicas, sleep, pause, prefix-cache resets,
LoRA, faults, metrics),
asked of every engine and their answers put together; and, for data-parallel ranks
behind one port (vLLM's internal load balancing), the rank of a request that names none:
`common.dp_balance.RankBalancer` over the (waiting, running) counts a coordinator task
reads from every engine every PUBLISH_INTERVAL_S (so they are as stale as vLLM's
coordinator's), plus what this front end sent since.

`EngineGroup` answers what `EngineClient` answers, so the apps and routes take either.
With one engine it passes every call straight through.

Does not know: HTTP, routes or ports (gateway.fleet opens them), the Session itself
(gateway.engine_client).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from inference_lab.common.dp_balance import PUBLISH_INTERVAL_S, Coordinator, RankBalancer
from inference_lab.common.exposition import merge_expositions
from inference_lab.gateway.backlog import Backlog
from inference_lab.gateway.engine_client import ClientGone, EngineClient, RequestStream
from inference_lab.gateway.errors import GatewayError
from inference_lab.v1 import engine_pb2 as pb

__all__ = ["EngineGroup", "ClientGone", "RequestStream"]

log = logging.getLogger(__name__)


class EngineGroup:
    """Clients of several engine processes that share one fleet of replica indices.

    `targets[k]` holds the indices `owners[k]` lists (None: those with index mod
    len(targets) = k). `balance` turns on data-parallel balancing for a request that
    names no replica: this front end is `client_index` of `client_count` (vLLM's API
    servers), which sets where its choices start."""

    def __init__(self, targets: Sequence[str], *, owners: Sequence[Sequence[int]] | None = None,
                 balance: bool = False, client_index: int = 0, client_count: int = 1,
                 **client_kwargs) -> None:
        if not targets:
            raise ValueError("an engine group needs at least one engine")
        self.backlog = Backlog()
        self.clients = [EngineClient(t, backlog=self.backlog, **client_kwargs) for t in targets]
        self.target = ",".join(targets)
        self.session_lane = self.clients[0].session_lane
        self._owner: dict[int, EngineClient] = {}
        if owners is not None:
            for client, indices in zip(self.clients, owners):
                for index in indices:
                    self._owner[index] = client
        self.ranks = sorted(self._owner) if owners is not None else list(range(len(targets)))
        self.balance = balance and len(self.ranks) > 1
        self._client_index, self._client_count = client_index, client_count
        self._balancers: dict[str, RankBalancer] = {}
        self._coordinators: dict[str, Coordinator] = {}
        self._coordinating: asyncio.Task | None = None

    # ---- which engine -------------------------------------------------------------------

    def client_for(self, replica: int | None) -> EngineClient:
        index = replica or 0
        client = self._owner.get(index)
        if client is None:
            client = self.clients[index % len(self.clients)]
        return client

    def pick_rank(self, model: str) -> int | None:
        """The data-parallel rank a request of `model` naming none runs on (None when this
        group does not balance): vLLM's choice from the coordinator's last counts and
        what this front end sent since (counted here)."""
        if not self.balance:
            return None
        return self.ranks[self._balancer(model).pick()]

    def _balancer(self, model: str) -> RankBalancer:
        balancer = self._balancers.get(model)
        if balancer is None:
            balancer = self._balancers[model] = RankBalancer(
                len(self.ranks), self._client_index, self._client_count)
        return balancer

    async def _coordinate(self) -> None:
        """Every PUBLISH_INTERVAL_S: every engine's (waiting, running) per model and rank,
        published to the model's balancer when the coordinator's rule says so."""
        position = {rank: i for i, rank in enumerate(self.ranks)}
        while True:
            await asyncio.sleep(PUBLISH_INTERVAL_S)
            try:
                rows = await self.get_capacity()
            except GatewayError:
                continue
            counts: dict[str, list[tuple[int, int]]] = {}
            for row in rows:
                slot = position.get(row.replica)
                if slot is None:
                    continue
                table = counts.setdefault(row.model, [(0, 0)] * len(self.ranks))
                table[slot] = (row.waiting, row.running)
            now = time.monotonic()
            for model, table in counts.items():
                coordinator = self._coordinators.setdefault(model, Coordinator())
                if coordinator.due(now, table):
                    self._balancer(model).publish(table, now)

    # ---- the hot path ------------------------------------------------------------------

    async def open(self, model: str, prompt, max_tokens, *, replica: int | None = None,
                   **kwargs) -> RequestStream:
        return await self.client_for(replica).open(model, prompt, max_tokens,
                                                   replica=replica, **kwargs)

    def refusal(self, model: str, prompt_tokens: int, max_tokens: int | None, n: int = 1,
                replica: int | None = None, arrived: float | None = None) -> str | None:
        return self.client_for(replica).refusal(model, prompt_tokens, max_tokens, n, replica,
                                                arrived)

    def may_refuse(self, arrived: float | None) -> bool:
        # (a balanced request's rank is chosen by its handler: the edge leaves it there)
        return not self.balance and any(c.may_refuse(arrived) for c in self.clients)

    def cancel(self, stream: RequestStream, reason: BaseException | None = None) -> None:
        self.client_for(stream.replica).cancel(stream, reason)

    @property
    def inflight(self) -> int:
        return sum(c.inflight for c in self.clients)

    # ---- connection --------------------------------------------------------------------

    def connect_soon(self) -> None:
        for client in self.clients:
            client.connect_soon()
        if self.balance and self._coordinating is None:
            self._coordinating = asyncio.get_running_loop().create_task(self._coordinate())

    async def close(self) -> None:
        if self._coordinating is not None:
            self._coordinating.cancel()
            await asyncio.gather(self._coordinating, return_exceptions=True)
            self._coordinating = None
        await asyncio.gather(*(c.close() for c in self.clients))

    # ---- models (every engine serves the same ones) ---------------------------------------

    async def list_models(self, refresh: bool = False) -> list[pb.ModelInfo]:
        return await self.clients[0].list_models(refresh)

    def known_model(self, name: str) -> pb.ModelInfo | None:
        return self.clients[0].known_model(name)

    async def resolve_model(self, name: str) -> pb.ModelInfo:
        return await self.clients[0].resolve_model(name)

    async def load_lora_adapter(self, name: str, path: str, base: str = "") -> str:
        messages = await asyncio.gather(*(c.load_lora_adapter(name, path, base)
                                          for c in self.clients))
        return messages[0]

    async def unload_lora_adapter(self, name: str) -> str:
        messages = await asyncio.gather(*(c.unload_lora_adapter(name) for c in self.clients))
        return messages[0]

    # ---- every replica: asked of every engine -------------------------------------------

    async def _rows(self, calls) -> list[pb.ModelCapacity]:
        replies = await asyncio.gather(*calls)
        rows = [row for reply in replies for row in reply]
        order = {}
        for row in rows:  # models in the first engine's order, then by replica index
            order.setdefault(row.model, len(order))
        return sorted(rows, key=lambda r: (order[r.model], r.replica))

    async def _one_or_all(self, replica: int | None, call) -> list[pb.ModelCapacity]:
        """`call(client, replica)` on the engine holding `replica`, or on every engine
        (replica None) with their rows put together."""
        if replica is not None:
            return await call(self.client_for(replica), replica)
        return await self._rows(call(c, None) for c in self.clients)

    async def get_capacity(self, model: str | None = None,
                           replica: int | None = None) -> list[pb.ModelCapacity]:
        return await self._one_or_all(replica, lambda c, r: c.get_capacity(model, r))

    async def kv_event_sources(self, replica: int | None = None) -> list[pb.KvEventSource]:
        if replica is not None:
            return await self.client_for(replica).kv_event_sources(replica)
        replies = await asyncio.gather(*(c.kv_event_sources() for c in self.clients))
        return sorted((s for reply in replies for s in reply), key=lambda s: s.replica)

    async def set_capacity(self, model: str | None = None, max_num_seqs: int | None = None,
                           max_waiting: int | None = None,
                           replica: int | None = None) -> list[pb.ModelCapacity]:
        return await self._one_or_all(
            replica, lambda c, r: c.set_capacity(model, max_num_seqs, max_waiting, r))

    async def set_replicas(self, model: str | None, replicas: int) -> list[pb.ModelCapacity]:
        # every engine takes the fleet's count and keeps its own share of the indices
        return await self._rows(c.set_replicas(model, replicas) for c in self.clients)

    async def sleep(self, model: str | None, replica: int | None, level: int = 0,
                    wake: bool = False, tags: list[str] | None = None) -> list[pb.ModelCapacity]:
        return await self._one_or_all(replica, lambda c, r: c.sleep(model, r, level, wake, tags))

    async def pause(self, model: str | None, replica: int | None, mode: int = 0,
                    clear_cache: bool = True, resume: bool = False) -> list[pb.ModelCapacity]:
        return await self._one_or_all(
            replica, lambda c, r: c.pause(model, r, mode, clear_cache, resume))

    async def reset_prefix_cache(self, model: str | None, replica: int | None,
                                 external: bool = False) -> int:
        if replica is not None:
            return await self.client_for(replica).reset_prefix_cache(model, replica, external)
        return sum(await asyncio.gather(*(c.reset_prefix_cache(model, None, external)
                                          for c in self.clients)))

    # ---- metrics ------------------------------------------------------------------------

    async def replica_metrics(self, replica: int) -> bytes:
        return await self.client_for(replica).replica_metrics(replica)

    def replica_metrics_now(self, replica: int) -> bytes | None:
        return self.client_for(replica).replica_metrics_now(replica)

    def replica_metrics_if_fed(self, replica: int) -> bytes | None:
        return self.client_for(replica).replica_metrics_if_fed(replica)

    def copy_waits(self, replica: int) -> int:
        return self.client_for(replica).copy_waits(replica)

    async def metrics_text(self, models: list[str] | None = None,
                           engines: list[int] | None = None) -> bytes:
        """Every engine's exposition as one (vLLM's multiprocess exposition: one scrape
        shows every rank, each sample labelled with its `engine`)."""
        if engines is None:
            chosen = [(c, None) for c in self.clients]
        else:
            by_client: dict[int, tuple[EngineClient, list[int]]] = {}
            for index in engines:
                client = self.client_for(index)
                by_client.setdefault(id(client), (client, []))[1].append(index)
            chosen = list(by_client.values())
        texts = await asyncio.gather(*(c.metrics_text(models, e) for c, e in chosen))
        return merge_expositions([t for t in texts if t])

    # ---- faults and health --------------------------------------------------------------

    async def inject_fault(self, kind: int, seconds: float = 0.0, factor: float = 0.0,
                           replica: int | None = None) -> pb.EngineFaultState:
        if replica is not None:
            return await self.client_for(replica).inject_fault(kind, seconds, factor, replica)
        states = await asyncio.gather(*(c.inject_fault(kind, seconds, factor)
                                        for c in self.clients))
        return states[0]

    async def fault_state(self, replica: int | None = None) -> pb.EngineFaultState:
        return await self.client_for(replica).fault_state(replica)

    async def stalled_for(self, replica: int) -> float:
        return await self.client_for(replica).stalled_for(replica)

    async def serving(self) -> bool:
        return all(await asyncio.gather(*(c.serving() for c in self.clients)))
