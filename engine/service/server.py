"""The engine process's lifecycle: gRPC server, health, reflection, metrics endpoint.

Knows how the pieces start and stop, in order. Start: cores and pacers, the gRPC server
(Engine, vLLM's VllmEngine, health, reflection), the Prometheus endpoint, then health SERVING. Stop:
health NOT_SERVING and refuse new work, let in-flight requests finish within a grace
period, stop the server, then the pacers (which abort whatever is left).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from inference_lab.common.state_file import read_state, write_state
from inference_lab.engine.sim.core import CapacityError, EngineCore
from inference_lab.engine.sim.kv_transfer import (
    ABORT_TIMEOUT_S, BOTH, HOLD_SHARE, NONE, SIDE_CHANNEL_PORT, LinkQueue, link_preset,
)
from inference_lab.engine.service.holds import Holds
from inference_lab.engine.service.kv_events import KVEventsConfig, ReplicaPublishers
from inference_lab.engine.service.lane import SessionLane
from inference_lab.engine.service.lora_modules import LoraModule, read_rank
from inference_lab.engine.sim.lengths import OutputLength
from inference_lab.engine.metrics.exposition import MetricsRegistry
from inference_lab.engine.service.metrics_http import serve_metrics
from inference_lab.engine.sim.lora import LoraError
from inference_lab.engine.service.replica_faults import ReplicaFaults
from inference_lab.engine.drivers.data_parallel import is_moe
from inference_lab.engine.drivers.lockstep import Lockstep
from inference_lab.engine.fleet.replicas import Fleet, Shard
from inference_lab.engine.service.lockstep import LockstepLink
from inference_lab.engine.fleet.runtime import ModelRuntime
from inference_lab.engine.fleet.startup import startup_delay
from inference_lab.engine.service.rpc import EngineService
from inference_lab.engine.sim.specs import Deployment
from inference_lab.engine.service.wire_guard import DecodeGuard
from inference_lab.engine.service.access import AccessGuard
from inference_lab.engine.service import vllm_grpc
from inference_lab.v1 import engine_pb2, engine_pb2_grpc
from inference_lab.vllm_grpc import vllm_engine_pb2_grpc

log = logging.getLogger(__name__)

# No fixed cap on mid-stream token updates: every step is delivered, and grouping is left to
# measured lateness (engine.drivers.cadence).
DEFAULT_UPDATE_RATE = 0.0
# The engine's own /metrics port: beside its gRPC port, outside Prometheus' exporter range
# (9100-9999 is allocated to exporters; 9400 is NVIDIA DCGM's).
DEFAULT_METRICS_PORT = 50052
CAPACITY_STATE_FILE = "capacity.json"
SERVICE_NAME = engine_pb2.DESCRIPTOR.services_by_name["Engine"].full_name


class EngineServer:
    def __init__(self, deployments: list[Deployment], host: str = "127.0.0.1", port: int = 50051,
                 metrics_port: int | None = DEFAULT_METRICS_PORT, control_token: str | None = None,
                 api_key: str | None = None,
                 update_rate: float = DEFAULT_UPDATE_RATE, time_scale: float = 1.0,
                 coalesce_when_late: bool = True,
                 engine_index: int = 0, state_dir: str | Path | None = None,
                 kv_events: KVEventsConfig | None = None, kv_events_expose_replay: bool = False,
                 kv_cache_metrics_sample: float = 0.0, mfu_metrics: bool = False,
                 lora_modules: list[LoraModule] | None = None, max_loras: int = 0,
                 replicas: int = 1, startup_delay: float | str = 0.0,
                 lengths: OutputLength | None = None, session_lane: str = "auto",
                 sleep_mode: bool = False, reasoning: bool = False,
                 kv_roles: tuple[str, ...] = (), kv_link: str = "rdma",
                 kv_abort_timeout: float = ABORT_TIMEOUT_S,
                 kv_hold_share: float = HOLD_SHARE, shard: Shard = Shard(),
                 data_parallel: bool = False, lockstep_ports: list[int] | None = None) -> None:
        self.deployments = deployments
        # The replica indices this process holds (several engine processes share a fleet:
        # engine.fleet.replicas), and whether they are data-parallel ranks of one server
        # (their KV events and server info say their rank) or independent servers (rank 0).
        self.shard = shard
        self.data_parallel = data_parallel
        # A rank of its own process: every rank's lockstep port, in rank order (an MoE
        # model's ranks step together: engine.service.lockstep); None: no lockstep.
        self.lockstep_ports = list(lockstep_ports or []) if data_parallel and shard.of > 1 else []
        self._lockstep: LockstepLink | None = None
        # P/D disaggregation: replica i's kv_role (kv_both beyond the list; no connector
        # without one), the link its pulls cross, how long a producer holds a handoff nobody
        # pulls (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT), the share of a replica's KV cache
        # its handoffs may hold
        self.kv_roles = tuple(kv_roles)
        self.kv_link = kv_link
        self.kv_abort_timeout = kv_abort_timeout
        self.kv_hold_share = kv_hold_share
        self.session_lane = session_lane  # "auto": a same-host Session lane; "off": gRPC only
        self.lane: SessionLane | None = None
        self.replicas = replicas  # of every model at start
        self.startup_delay = startup_delay  # seconds or "auto" (engine.fleet.startup)
        self.lengths = lengths  # output lengths when max_tokens is absent (engine.sim.lengths)
        self.update_rate = update_rate  # forced cap on mid-stream token updates/s per model
        self.coalesce_when_late = coalesce_when_late  # group tokens when the pacer is late
        self.time_scale = time_scale  # modelled seconds per wall second (engine.drivers.pacer)
        self.sleep_mode = sleep_mode  # replicas may sleep and wake (vLLM's --enable-sleep-mode)
        self.reasoning = reasoning  # reasoning models reason unless a request says otherwise
        # Live capacity is saved here after every SetCapacity and restored at start.
        # (one file per engine index, and per shard of a fleet over several processes, so
        # that engines sharing a directory keep their own)
        name = CAPACITY_STATE_FILE if not engine_index else f"capacity-{engine_index}.json"
        if shard.of > 1:
            name = name.replace(".json", f"-shard{shard.part}of{shard.of}.json")
        self.state_path = Path(state_dir) / name if state_dir else None
        # The secrets the RPCs need (engine.service.access): the control token for calls
        # that change state, either for those that generate; neither set: no check.
        self.control_token = control_token
        self.api_key = api_key
        self.host = host
        self.port = port
        self.metrics_port = metrics_port
        self.engine_index = engine_index  # the `engine` label of every metric
        self.kv_events_config = kv_events  # vLLM's --kv-events-config, when given
        self.kv_events_expose_replay = kv_events_expose_replay  # replays beyond loopback
        self.kv_cache_metrics_sample = kv_cache_metrics_sample  # --kv-cache-metrics (0: off)
        self.mfu_metrics = mfu_metrics  # --enable-mfu-metrics
        self.kv_events: ReplicaPublishers | None = None  # one publisher per replica
        # LoRA: max_loras > 0 enables adapters on every model (vLLM's --enable-lora)
        self.lora_modules = list(lora_modules or [])
        self.max_loras = max_loras
        self.server: grpc.aio.Server | None = None
        self.health = health.aio.HealthServicer()
        self.fleet: Fleet | None = None
        self.metrics: MetricsRegistry | None = None
        self.holds = Holds()  # the Sessions' holds, which every pacer reads
        # saved capacity of replicas not started yet: (model, index) -> knobs
        self._pending_capacity: dict[tuple[str, int], dict] = {}
        self._metrics_http = None

    @property
    def runtimes(self) -> list[ModelRuntime]:
        """Every replica's runtime, by model then replica index."""
        return self.fleet.runtimes() if self.fleet is not None else []

    def _make_runtime(self, deployment: Deployment, replica: int) -> ModelRuntime:
        """A replica of its own (its core holds its own live capacity; the deployment is
        shared and never written)."""
        events = self.kv_events is not None and deployment.scheduler.enable_prefix_caching
        core = EngineCore(deployment, self.lengths, record_kv_events=events,
                          kv_cache_metrics_sample=self.kv_cache_metrics_sample,
                          mfu_metrics=self.mfu_metrics)
        self._connect(core, replica)
        publishes = events and core.prefix_cache is not None
        runtime = ModelRuntime(core, self.metrics.for_replica(core, replica), self.update_rate,
                               self.time_scale,
                               self.kv_events.acquire(replica, core) if publishes else None,
                               self.coalesce_when_late, replica, hold=self.holds)

        def stopped() -> None:  # a drained replica: its series and its events go
            self.metrics.remove(runtime.metrics)
            if publishes and self.kv_events is not None:
                self.kv_events.release(replica, core)

        runtime.on_stopped = stopped
        pending = self._pending_capacity.pop((core.name, replica), None)
        if pending is not None:  # saved by an earlier run with more replicas
            self._apply_capacity(runtime, pending)
        if self._lockstep is not None and is_moe(deployment):
            index = [d.name for d in self.deployments].index(deployment.name)
            runtime.pacer.lockstep = Lockstep(self._lockstep.sender(index))
            runtime.pacer.on_dummy = runtime.metrics.on_dummy_pass
        faults = getattr(getattr(self, "service", None), "replica_faults", None)
        if faults is not None:  # a replica added (or restarted) while a fault is in force
            faults.apply([runtime])
        if self.max_loras:  # a replica added live gets LoRA and the adapters loaded so far
            core.enable_lora(self.max_loras)
            if getattr(self, "service", None) is not None:
                self.service.adapt(runtime)
        return runtime

    def _connect(self, core: EngineCore, replica: int) -> None:
        """The replica's KV connector, as vLLM's NixlConnector names itself: its role, a
        fresh engine id, the side channel (host, VLLM_NIXL_SIDE_CHANNEL_PORT + its rank).
        Without --kv-roles it has none (NONE: kv_transfer_params are ignored)."""
        if not self.kv_roles:
            core.kv_role = NONE
        else:
            core.kv_role = self.kv_roles[replica] if replica < len(self.kv_roles) else BOTH
        core.link = LinkQueue(link_preset(self.kv_link, core.deployment.hardware))
        core.handoffs.timeout = self.kv_abort_timeout
        # at least one block, so that a share of a small cache still holds a handoff
        core.handoffs.max_blocks = max(1, int(core.total_blocks * self.kv_hold_share))
        host = self.host if self.host not in ("", "0.0.0.0", "::") else socket.gethostname()
        core.kv_identity = {"remote_engine_id": str(uuid.uuid4()), "remote_host": host,
                            "remote_port": SIDE_CHANNEL_PORT + replica}

    def _fleet_changed(self) -> None:
        if getattr(self, "service", None) is not None:
            self.service.fleet_changed()

    async def start(self) -> None:
        events = self.kv_events_config is not None and self.kv_events_config.enabled
        if events:
            self.kv_events = ReplicaPublishers(self.kv_events_config, self.engine_index,
                                               self.kv_events_expose_replay, self.data_parallel)
        self.metrics = MetricsRegistry(engine_index=self.engine_index)
        if self.lockstep_ports and any(is_moe(d) for d in self.deployments):
            self._lockstep = await LockstepLink(self.lockstep_ports[self.shard.part],
                                                self.lockstep_ports, self._peer_step).open()
        setting = self.startup_delay
        self.fleet = Fleet(self.deployments, self._make_runtime,
                           lambda d: startup_delay(d, setting), on_change=self._fleet_changed,
                           shard=self.shard)
        self.service = None
        self.fleet.scale("", self.replicas)
        self.service = EngineService(self.fleet, self.metrics, self.holds)
        self.service.kv_events = self.kv_events
        self.service.sleep_mode = self.sleep_mode
        self.service.reasoning = self.reasoning
        if self.max_loras:
            self._enable_lora()
        if self.state_path is not None:
            self._restore_capacity()
            self.service.on_capacity_change = self._save_capacity
        server = grpc.aio.server(interceptors=[
            AccessGuard(self.api_key, self.control_token), DecodeGuard()], options=[
            ("grpc.max_concurrent_streams", 100_000),
            ("grpc.so_reuseport", 0),
            ("grpc.keepalive_permit_without_calls", 1),
            # A connection that never completes its HTTP/2 handshake, or that carries no
            # call for five minutes, is closed (the gateway's Session is a call; its
            # channel reconnects by itself).
            ("grpc.server_handshake_timeout_ms", 10_000),
            ("grpc.max_connection_idle_ms", 300_000),
        ])
        engine_pb2_grpc.add_EngineServicer_to_server(self.service, server)
        # vLLM's own engine service beside the lab's, over the same funnel (engine.service.vllm_grpc)
        self.vllm_service = vllm_grpc.VllmEngineService(self.service)
        vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(self.vllm_service, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, vllm_grpc.SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME),
            server)
        bound = server.add_insecure_port(f"{self.host}:{self.port}")
        if not bound:
            raise OSError(f"cannot listen on {self.host}:{self.port}")
        self.port = bound
        await server.start()
        self.server = server
        if self.session_lane != "off":
            self.lane = SessionLane(self.service)
            await self.lane.start()
            self.service.lane = self.lane
        if self.metrics_port is not None:
            self._metrics_http = serve_metrics(self.metrics, self.host, self.metrics_port)
            self.metrics_port = self._metrics_http.server_port
        self.service.replica_faults = ReplicaFaults(lambda: self.runtimes, self._set_serving,
                                                    self._restart_replica)
        await self._set_serving(True)
        for rt in self.runtimes:
            log.info("serving %s replica %d on %s (tp=%d, %d KV blocks of %d, max_num_seqs=%d, "
                     "max_waiting=%d)", rt.core.name, rt.replica, rt.core.deployment.hardware.name,
                     rt.core.deployment.tp, rt.core.total_blocks, rt.core.block_size,
                     rt.core.max_num_seqs, rt.core.max_waiting)
        log.info("engine gRPC on %s:%d, metrics on %s", self.host, self.port,
                 f"http://{self.host}:{self.metrics_port}/metrics" if self.metrics_port else "off")

    def _enable_lora(self) -> None:
        """Adapters for every model, and the --lora-modules registered (LoraError on a
        bad one: the engine does not start)."""
        for rt in self.runtimes:
            if rt.core.loras is None:
                rt.core.enable_lora(self.max_loras)
        for module in self.lora_modules:
            if not module.base_model_name and len(self.deployments) > 1:
                raise LoraError(f"--lora-modules {module.name}: several models are served; "
                                "name the base with the JSON form's base_model_name")
            try:
                self.service.load_adapter(module.name, module.path, module.base_model_name,
                                          read_rank(module.path))
            except KeyError:
                raise LoraError(f"--lora-modules {module.name}: base model "
                                f"{module.base_model_name!r} is not served") from None

    def _restore_capacity(self) -> None:
        """Apply the live capacity saved by an earlier run, each replica its own (logged; a
        model no longer served, or a value its config now forbids, is skipped with a
        warning). A file from before replicas (one set of knobs per model) applies to every
        replica; a saved replica this engine does not have yet is kept and applied when it
        is added (and saved meanwhile), so no operator setting is lost."""
        saved = read_state(self.state_path)  # StateFileError: refuse to start on a bad file
        if saved is None:
            return
        by_name: dict[str, dict[int, ModelRuntime]] = {}
        for rt in self.runtimes:
            by_name.setdefault(rt.core.name, {})[rt.replica] = rt
        for name, knobs in (saved.get("capacity") or {}).items():
            replicas = by_name.get(name)
            if replicas is None or not isinstance(knobs, dict):
                log.warning("%s: saved capacity of %r ignored (not served here)",
                            self.state_path, name)
                continue
            own = knobs.get("replicas")
            own = {int(k): v for k, v in own.items() if k.isdigit() and isinstance(v, dict)} \
                if isinstance(own, dict) else {}
            for index, rt in sorted(replicas.items()):
                self._apply_capacity(rt, own.pop(index, knobs))
            for index, rest in own.items():  # replicas not started (yet): kept for later
                self._pending_capacity[(name, index)] = rest
                log.info("%s: saved capacity of %s replica %d kept until it is added",
                         self.state_path, name, index)

    def _apply_capacity(self, rt: ModelRuntime, knobs: dict) -> None:
        seqs, waiting = knobs.get("max_num_seqs"), knobs.get("max_waiting")
        try:
            rt.core.set_capacity(seqs if type(seqs) is int else None,
                                 waiting if type(waiting) is int else None)
        except CapacityError as exc:
            log.warning("%s: saved capacity of %s replica %d ignored: %s", self.state_path,
                        rt.core.name, rt.replica, exc)
            return
        rt.check_queue()
        log.info("restored live capacity of %s%s from %s: max_num_seqs=%d max_waiting=%d",
                 rt.core.name, f" replica {rt.replica}" if rt.replica else "", self.state_path,
                 rt.core.max_num_seqs, rt.core.max_waiting)

    async def _restart_replica(self, index: int) -> None:
        """A crashed replica comes back (engine.fleet.Fleet.restart) with the live capacity
        it had, as a restarted engine restores its saved one."""
        knobs = {r.model: (r.runtime.core.max_num_seqs, r.runtime.core.max_waiting)
                 for r in self.fleet.select("", index)}
        for replica in await self.fleet.restart(index):
            fresh = self.fleet.replicas[replica.model][index].runtime
            fresh.core.set_capacity(*knobs[replica.model])
            fresh.check_queue()

    def _save_capacity(self) -> None:
        """Every replica's own knobs (under `replicas`, by index), with the lowest replica's
        also at the model's level (what a file from before replicas held), plus saved
        replicas not added yet."""
        capacity: dict[str, dict] = {}
        for rt in self.runtimes:
            knobs = {"max_num_seqs": rt.core.max_num_seqs, "max_waiting": rt.core.max_waiting}
            entry = capacity.setdefault(rt.core.name, {**knobs, "replicas": {}})
            entry["replicas"][str(rt.replica)] = knobs
        for (name, index), knobs in self._pending_capacity.items():
            entry = capacity.get(name)
            if entry is not None:
                entry["replicas"].setdefault(str(index), knobs)
        try:
            write_state(self.state_path, {"capacity": capacity})
        except OSError as exc:
            log.error("cannot save the live capacity to %s: %s", self.state_path, exc)

    async def _set_serving(self, serving: bool) -> None:
        """gRPC health of the engine (NOT_SERVING while a stall fault lasts)."""
        if self.server is None or not self.service.accepting:
            return  # stopping: health stays NOT_SERVING
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    def live_requests(self) -> int:
        return sum(rt.pacer.open_streams() for rt in self.runtimes)

    def _peer_step(self, model: int, start: float, end: float) -> None:
        """A peer rank booked a step of the model at index `model` (wall instants)."""
        if not 0 <= model < len(self.deployments) or self.fleet is None:
            return
        for replica in self.fleet.replicas.get(self.deployments[model].name, {}).values():
            replica.runtime.pacer.peer_step(start, end)

    async def stop(self, grace: float = 5.0) -> None:
        """Graceful: NOT_SERVING, refuse new work, drain up to `grace` seconds, stop."""
        if self.server is None:
            return
        await self.health.enter_graceful_shutdown()
        self.service.accepting = False
        deadline = time.monotonic() + grace
        while self.live_requests() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await self.fleet.stop()  # pacers abort what is left; its streams get a Finished
        await self.service.close_sessions()
        if self.lane is not None:
            self.service.lane = None
            await self.lane.stop()
            self.lane = None
        await self.server.stop(grace=0.5)
        self.server = None
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()
            self._metrics_http = None
        if self.kv_events is not None:
            self.kv_events.close()
            self.kv_events = None
        if self._lockstep is not None:
            self._lockstep.close()
            self._lockstep = None
        log.info("engine stopped")
