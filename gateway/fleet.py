"""One HTTP listener per engine replica: replica i on the base port + i.

Knows: which replica indices the engine has (GetCapacity lists model x replica), that
each index gets its own aiohttp app (gateway.app with `replica=i`: the full OpenAI API,
/health, /health/ready, /control/capacity and /metrics of that replica) on its own port,
all sharing one EngineClient (one Session), and the base port's extra routes
`GET/POST /control/replicas`, which add or drain replicas live (SetReplicas), and
`GET /fleet/targets` (every replica's port, for Prometheus HTTP service discovery). A new
replica's port opens at once (it answers 503 until ready); a drained one's port closes
once the engine has closed the replica, that is once its in-flight requests finished.
The base port stays open whatever happens (it carries the control API); a model scaled to
0 answers 503 there until a replica is ready again.

The replica set is read from the engine when the gateway starts (and again until the
engine answers), after every /control/replicas call, and, while a replica is draining or
starting, every RECONCILE_S until it is closed or ready; nothing is polled otherwise.

Several engine processes (gateway.engines) share the indices: the listeners are the
same, and each app's requests go to the engine that holds its replica. Data-parallel
ranks behind one port (vLLM's internal load balancing: `replica_ports` off) open the base
port alone, an app of no replica whose requests go to the rank `X-data-parallel-rank`
names, else to the one the balancer picks. Several gateway processes (API servers) may
listen on the same ports (`reuse_port`); each follows the replica set every FOLLOW_S,
since another one may change it.

Does not know: routes of the OpenAI API (gateway.app), gRPC (gateway.engine_client).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any

import msgspec
from aiohttp import web

from inference_lab.common.control_rows import replica_row
from inference_lab.gateway import cors, dashboard
from inference_lab.gateway.app import STATE, create_app
from inference_lab.gateway.engine_client import EngineClient
from inference_lab.gateway.engines import EngineGroup
from inference_lab.gateway.errors import ErrorKind, GatewayError
from inference_lab.gateway.middleware import read_json_body
from inference_lab.gateway.protocols.base import decode, json_encode, query_text
from inference_lab.gateway.server import start_gateway
from inference_lab.v1 import engine_pb2 as pb

log = logging.getLogger("inference_lab.gateway.fleet")

RECONCILE_S = 0.2  # how often the listeners follow a replica that is draining or starting
FOLLOW_S = 1.0  # how often one of several API servers re-reads the replica set
_U32 = 2**32 - 1


class ReplicasUpdate(msgspec.Struct, forbid_unknown_fields=True):
    replicas: Annotated[int, msgspec.Meta(ge=0, le=_U32)]
    model: str | None = None


_replicas_decoder = msgspec.json.Decoder(ReplicasUpdate)
FLEET: web.AppKey["FleetGateway"] = web.AppKey("fleet", object)


class FleetGateway:
    """The listeners of every replica index, in front of one engine."""

    def __init__(self, engine_target: str | list[str], host: str = "127.0.0.1", port: int = 8080,
                 header_timeout: float | None = None, backlog: int | None = None, *,
                 owners: list[list[int]] | None = None, balance: bool = False,
                 replica_ports: bool = True, api_server: tuple[int, int] = (0, 1),
                 data_parallel: bool = False, **app_kwargs: Any) -> None:
        """`engine_target`: one engine, or several sharing the fleet (`owners[k]`: the
        indices engine k holds; None: index mod the number of engines). `balance`:
        data-parallel balancing of requests that name no rank; `replica_ports` False:
        the base port alone fronts every replica. `api_server`: (this process's index,
        how many share the ports). `data_parallel`: the replicas are the data-parallel
        ranks of one server (what /get_server_info says), not independent servers."""
        targets = [engine_target] if isinstance(engine_target, str) else list(engine_target)
        self.engine_targets = targets
        self.engine_target = ",".join(targets)
        self.owners = owners
        self.balance = balance
        self.data_parallel = data_parallel
        self.replica_ports = replica_ports
        self.api_server = api_server
        self.host = host
        self.base_port = port
        self.app_kwargs = app_kwargs
        self.runner_kwargs = {} if header_timeout is None else {"header_timeout": header_timeout}
        if backlog is not None:
            self.runner_kwargs["backlog"] = backlog
        if api_server[1] > 1:
            self.runner_kwargs["reuse_port"] = True
        self.client: EngineClient | EngineGroup | None = None
        self.listeners: dict[int, tuple[web.AppRunner, int]] = {}  # replica -> (runner, port)
        self._reconciling: asyncio.Lock = asyncio.Lock()
        self._follow: asyncio.Task | None = None
        self._background: set[asyncio.Task] = set()

    # ---- lifecycle -----------------------------------------------------------------------
    async def start(self) -> int:
        """Open the base port (replica 0); returns its bound port. The other replicas'
        ports open as soon as the engine says they exist."""
        secrets = {"control_token": self.app_kwargs.get("control_token"),
                   "api_key": self.app_kwargs.get("api_key"),
                   "session_lane": self.app_kwargs.get("session_lane")}
        if len(self.engine_targets) == 1 and not self.balance:
            self.client = EngineClient(self.engine_targets[0], **secrets)
        else:
            self.client = EngineGroup(self.engine_targets, owners=self.owners,
                                      balance=self.balance, client_index=self.api_server[0],
                                      client_count=self.api_server[1], **secrets)
        await self._open(0)
        if self.replica_ports:
            self._spawn(self._discover())
            if self.api_server[1] > 1:
                self._spawn(self._follow_peers())
        return self.listeners[0][1]

    async def stop(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        for index in sorted(self.listeners, reverse=True):
            runner, _ = self.listeners.pop(index)
            await runner.cleanup()
        if self.client is not None:
            await self.client.close()

    def port_states(self) -> dict:
        """{replica index: (port, its app's state)} of every listener (the dashboard's
        feed reads each port's own series); None for the index of a port of no replica."""
        return {(index if self.replica_ports else None): (port, runner.app[STATE])
                for index, (runner, port) in self.listeners.items()}

    def port_of(self, index: int) -> int | None:
        listener = self.listeners.get(index)
        return listener[1] if listener else None

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _follow_peers(self) -> None:
        """One of several API servers: another may add or drain replicas; follow it."""
        while True:
            await asyncio.sleep(FOLLOW_S)
            try:
                await self.reconcile()
            except GatewayError:
                pass

    async def _discover(self) -> None:
        """Read the replica set once the engine answers (it may start after us)."""
        delay = 0.1
        while True:
            try:
                await self.reconcile()
                return
            except GatewayError:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    # ---- listeners ----------------------------------------------------------------------
    async def _open(self, index: int) -> None:
        app = create_app(self.engine_target, replica=index if self.replica_ports else None,
                         engine=self.client, data_parallel=self.data_parallel,
                         **self.app_kwargs)
        if index == 0:
            app[FLEET] = self
            app[dashboard.PORTS] = self.port_states
            app.router.add_get("/control/replicas", get_replicas)
            app.router.add_post("/control/replicas", set_replicas)
            app.router.add_get("/fleet/targets", targets)
            cors.add_routes(app)  # the base port's own paths answer preflights too
        port = self.base_port + index if self.base_port else 0
        runner, bound = await start_gateway(app, self.host, port, **self.runner_kwargs)
        self.listeners[index] = (runner, bound)
        if index:
            log.info("replica %d listening on http://%s:%d", index, self.host, bound)

    async def reconcile(self, rows: list[pb.ModelCapacity] | None = None) -> list[pb.ModelCapacity]:
        """Open a port for every replica index the engine has, close the ports of indices
        it no longer has (never the base port); returns every replica's row."""
        async with self._reconciling:
            if rows is None:
                rows = await self.client.get_capacity()
            wanted = {row.replica for row in rows} | {0}
            for index in sorted(wanted - self.listeners.keys()):
                try:
                    await self._open(index)
                except OSError as exc:  # (its row shows port null; retried next time)
                    log.error("replica %d: cannot listen on port %d: %s", index,
                              self.base_port + index, exc)
            for index in sorted(self.listeners.keys() - wanted, reverse=True):
                runner, port = self.listeners.pop(index)
                await runner.cleanup()
                log.info("replica %d closed: port %d closed", index, port)
            if any(row.draining or row.starting for row in rows) and (
                    self._follow is None or self._follow.done()):
                self._follow = self._spawn(self._follow_changes())
            return rows

    async def _follow_changes(self) -> None:
        """While a replica drains or starts: re-read until the set is settled."""
        while True:
            await asyncio.sleep(RECONCILE_S)
            try:
                rows = await self.client.get_capacity()
            except GatewayError:
                continue
            await self.reconcile(rows)
            if not any(row.draining or row.starting for row in rows):
                return

    def rows_json(self, rows: list[pb.ModelCapacity]) -> bytes:
        return json_encode([
            replica_row(r.model, r.replica, self.port_of(r.replica), r.starting, r.draining,
                        r.ready_in_s, r.waiting, r.running, r.kv_role)
            for r in rows])


# ---- the base port's /control/replicas ----------------------------------------------------


async def get_replicas(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    rows = await fleet.client.get_capacity(query_text(request.query, "model"))
    return web.Response(body=fleet.rows_json(rows), content_type="application/json")


async def set_replicas(request: web.Request) -> web.Response:
    """POST {"model"?, "replicas": N}: add or drain replicas live; answers every replica
    of the model(s) with its port (new ports are already open)."""
    fleet = request.app[FLEET]
    body = await read_json_body(request, request.app[STATE].max_body_bytes)
    update = decode(_replicas_decoder, body, "replicas update",
                    'expected {"model"?: string, "replicas": integer >= 0}')
    if fleet.data_parallel:
        raise GatewayError(ErrorKind.INVALID_REQUEST,
                           "the data-parallel ranks are set at start (serve "
                           "--data-parallel-size D): /control/replicas adds and drains "
                           "independent replicas (serve --replicas N) only")
    rows = await fleet.client.set_replicas(update.model, update.replicas)
    everything = await fleet.reconcile()  # new ports open before the answer
    rows = [r for r in everything if not update.model or r.model == update.model]
    return web.Response(body=fleet.rows_json(rows), content_type="application/json")


async def targets(request: web.Request) -> web.Response:
    """GET /fleet/targets: every replica's port as Prometheus HTTP service discovery wants
    it ([{"targets": ["host:port"], "labels": {"replica": "i"}}]), the host being the one
    the caller reached this port by."""
    fleet = request.app[FLEET]
    host = (request.host or fleet.host).rsplit(":", 1)[0]
    groups = [{"targets": [f"{host}:{port}"], "labels": {"replica": str(index)}}
              for index, (_, port) in sorted(fleet.listeners.items())]
    return web.Response(body=json_encode(groups), content_type="application/json")
