"""A capacity experiment as a TOML file: what to serve, the load, the controller, and a
timeline of actions at given (modelled) seconds.

    name = "reference-page"
    duration = 60                       # modelled seconds
    model = "gpt-oss-20b"
    window = 2.0                        # seconds per plotted window (default 2)

    [server]                            # used by --serve (ignored with --url)
    config = "../gpt-oss-20b.toml"      # relative to this file; default: the embedded model
    hardware = "b200"
    max_num_seqs = 256                  # set through /control/capacity at the start
    max_waiting = 0
    time_scale = 1.0                    # --time-scale overrides
    data_parallel_size = 1              # ranks per replica (--virtual only): vLLM's
                                        # balancer, an MoE model's ranks in lockstep
    kv_offloading_size = 256            # GiB of host KV tier per replica (vLLM's
                                        # --kv-offloading-size; absent: off)

    [load]                              # the keys of inference_lab.common.workload ...
    arrival_pattern = "closed_loop"     # closed_loop | poisson
    num_concurrent_users = 24           # closed_loop
    arrival_rate = 50.0                 # poisson: requests per second
    input_len_dist = { type = "fixed", value = 16 }
    output_len_dist = { type = "fixed", value = 200 }
    seed = 1
    retry_after_529 = 0.1               # ... plus: a closed-loop user's pause after a 529

    [controller]
    name = "fixed"                      # fixed | aimd | vegas | gradient2 | envoy | sre
    rtt = "e2e"                         # the latency sample: e2e | ttft | per_token
    params = { limit = 24 }             # the class's keyword arguments (published defaults)

    [[timeline]]
    at = 30
    capacity = { max_num_seqs = 8 }     # POST /control/capacity
    [[timeline]]
    at = 45
    load = { num_concurrent_users = 48 }   # or { arrival_rate = 80 }
    label = "double the users"
    [[timeline]]
    at = 50
    fault = { kind = "slow", factor = 3, seconds = 5 }   # see FAULT_KEYS
    [[timeline]]
    at = 55
    replicas = 4                        # POST /control/replicas (a fleet's manual scaling)

A fleet (autoscaling) adds, all optional but [fleet] or [autoscaler] making it one:

    scrape_interval = 5.0               # modelled s between scrapes of the queue gauges
    [fleet]
    replicas = 2                        # at the start (ready when the load starts)
    max_replicas = 16                   # the most any scaling may ask for (<= 64)
    startup_delay = "auto"              # a new replica's start-up: seconds or "auto"
    gpus_per_replica = 1                # for GPU-hours (default: the model's tp)
    poll_interval = 1.0                 # s between reads of the replica set (routing)
    metrics_interval = 15.0             # s between the autoscaler's scrapes of /metrics
    metrics_delay = 0.0                 # s more before a scrape is seen (a pipeline)
    kv_roles = "1:3"                    # a P/D fleet: P prefill + D decode replicas (P + D =
                                        # replicas), or a list of ratios to sweep, one run each
    pd_policy = "least_loaded"          # or "round_robin": the P/D router's pick in each pool
    [autoscaler]
    name = "hpa"                        # hpa | keda | slo | package.module:ClassName
    params = { metric = "vllm:num_requests_running", target = 48 }
    [slo]
    ttft_s = 2.0                        # bounds a request must meet (either or both)
    e2e_s = 30.0
    attainment = 0.99                   # the share that must meet them
    window = 300.0                      # s per oracle window

With `kv_roles` the load generator plays a P/D router (experiments.pd): each request's
prefill (max_tokens 1, do_remote_decode) goes to a prefill replica, then the request with
the returned kv_transfer_params to a decode replica; no autoscaler or `replicas` action.

The load may then be `trace` (common.traces) or poisson with a `rate_schedule`; requests
go round-robin to the ready replicas (as a Service in front of them).

A `fault` is one of FAULT_KEYS' kinds: `stall` (seconds), `slow` (factor, seconds; 0 =
until cleared), `crash` (POST /control/faults/replica), `errors` (the body of POST
/control/faults: rate, types, script, seed, retry hints, model; optional seconds), and
`clear` (ends every fault). Its seconds are modelled, like `at`; a fault with seconds
adds an implicit action at its end (`... ends`), so the phases split there.

Knows: the file's shape and its validation (errors name the file and key, via
common.toml). Does not know HTTP or the controllers' rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from inference_lab.common.fault_names import (ERROR_TYPES, MAX_FAULT_SECONDS, MAX_SLOW_FACTOR,
                                              OK_STEP)
from inference_lab.common.toml import ConfigError, Table, read_toml
from inference_lab.common.workload import WorkloadSpec, parse_workload, resolve_trace

__all__ = ["Action", "Scenario", "Phase", "FleetSpec", "SloSpec", "load_scenario", "parse_scenario",
           "ConfigError"]

RTT_KINDS = ("e2e", "ttft", "per_token")
PATTERNS = ("closed_loop", "poisson", "trace")
UNBOUNDED_REQUESTS = 10**9  # the workload parser wants a count; a scenario stops on time
_TOP = ("name", "description", "duration", "model", "window", "server", "load", "controller",
        "timeline", "fleet", "autoscaler", "slo", "scrape_interval")
_FLEET = ("replicas", "max_replicas", "startup_delay", "gpus_per_replica", "poll_interval",
          "metrics_interval", "metrics_delay", "kv_roles", "pd_policy")
PD_POLICIES = ("least_loaded", "round_robin")
_AUTOSCALER = ("name", "params")
_SLO = ("ttft_s", "e2e_s", "attainment", "window")
MAX_REPLICAS = 64
_SERVER = ("config", "hardware", "max_num_seqs", "max_waiting", "time_scale", "data_parallel_size",
           "kv_offloading_size")
_CONTROLLER = ("name", "rtt", "params")
_ACTION = ("at", "capacity", "load", "fault", "label", "replicas")
_CAPACITY = ("max_num_seqs", "max_waiting")
_LOAD_CHANGE = ("num_concurrent_users", "arrival_rate")
REPLICA_KINDS = ("stall", "slow", "crash")  # POST /control/faults/replica
ERROR_KEYS = ("model", "rate", "types", "script", "seed", "retry_after", "retry_after_ms",
              "should_retry")  # POST /control/faults
FAULT_KEYS = {
    "stall": ("kind", "seconds", "replica"),
    "slow": ("kind", "factor", "seconds", "replica"),
    "crash": ("kind", "replica"),
    "errors": ("kind", *ERROR_KEYS, "seconds"),
    "clear": ("kind",),
}
END = "end"  # the kind of the implicit action that ends a fault with seconds


@dataclass(frozen=True, slots=True)
class Action:
    at: float  # modelled seconds from the start
    capacity: dict = field(default_factory=dict)  # POST /control/capacity body
    load: dict = field(default_factory=dict)  # num_concurrent_users / arrival_rate
    label: str = ""
    fault: dict = field(default_factory=dict)  # {"kind": ..., the kind's keys}; see FAULT_KEYS
    replicas: int | None = None  # POST /control/replicas

    def describe(self) -> str:
        if self.label:
            return self.label
        parts = [f"{k}={v}" for k, v in {**self.capacity, **self.load}.items()]
        if self.replicas is not None:
            parts.append(f"replicas={self.replicas}")
        if self.fault:
            parts.append(describe_fault(self.fault))
        return ", ".join(parts)


def describe_fault(fault: dict) -> str:
    kind = fault["kind"]
    if kind == END:
        return f"{describe_fault(fault['of'])} ends"
    if kind == "stall":
        return f"stall {fault['seconds']:g} s"
    if kind == "slow":
        until = f" for {fault['seconds']:g} s" if fault.get("seconds") else ""
        return f"slow x{fault['factor']:g}{until}"
    if kind == "errors":
        what = []
        if "rate" in fault:
            what.append(f"{100 * fault['rate']:g} % {'/'.join(fault.get('types', ['any']))}")
        if "script" in fault:
            what.append(" ".join(f"{s['count']}x{s['error']}" for s in fault["script"]))
        hints = [k for k in ("retry_after", "retry_after_ms", "should_retry") if k in fault]
        if hints:
            what.append("hints " + ",".join(hints))
        until = f" for {fault['seconds']:g} s" if fault.get("seconds") else ""
        return f"errors {', '.join(what) or 'settings'}{until}"
    return "clear faults" if kind == "clear" else kind


@dataclass(frozen=True, slots=True)
class Phase:
    """The stretch between two actions, with the capacity and load in force."""

    index: int
    start: float
    end: float
    max_num_seqs: int
    max_waiting: int
    users: int | None
    rate: float | None
    action: Action | None  # the action that began it (None for the first)
    fault: str = ""  # the faults in force ("" = none)
    slowdown: float = 1.0  # step times x this (a `slow` fault in force)
    fault_modelled: bool = True  # the offline simulator models the faults in force (slow)


@dataclass(frozen=True, slots=True)
class FleetSpec:
    replicas: int = 1
    max_replicas: int = 16
    startup_delay: float | str = "auto"
    gpus_per_replica: int | None = None  # None: the deployment's tp
    poll_interval: float = 1.0
    metrics_interval: float = 15.0
    metrics_delay: float = 0.0
    kv_roles: tuple[tuple[int, int], ...] = ()  # P/D ratios (prefill, decode); () = no P/D
    pd_policy: str = "least_loaded"


@dataclass(frozen=True, slots=True)
class SloSpec:
    ttft_s: float | None = None
    e2e_s: float | None = None
    attainment: float = 0.99
    window: float = 300.0


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    duration: float  # modelled seconds of load
    model: str  # the served model's name, as requests name it
    workload: WorkloadSpec  # [load]
    controller: str = "fixed"  # a name of experiments.controllers
    controller_params: dict = field(default_factory=dict)
    rtt: str = "e2e"  # the latency the controller is given (RTT_KINDS)
    retry_after_529: float = 0.1  # modelled s a closed-loop user waits after a non-200 answer
    window: float = 2.0  # modelled s per window of the summary and the plots
    description: str = ""
    config: Path | None = None
    hardware: str = "b200"
    max_num_seqs: int = 256
    max_waiting: int = 0
    time_scale: float = 1.0
    data_parallel_size: int = 1  # ranks per replica (virtual time only)
    kv_offloading_size: float | None = None  # GiB of host KV tier per replica; None: off
    timeline: tuple[Action, ...] = ()
    path: str = ""
    fleet: FleetSpec | None = None  # a fleet of replicas (autoscaling scenarios)
    autoscaler: str = ""  # "" = none
    autoscaler_params: dict = field(default_factory=dict)
    slo: SloSpec | None = None
    scrape_interval: float | None = None  # modelled s between gauge scrapes (None: 0.25 wall s)

    def with_autoscaler(self, name: str, params: dict | None = None) -> "Scenario":
        same = name == self.autoscaler
        return replace(self, autoscaler=name, fleet=self.fleet or FleetSpec(),
                       autoscaler_params=params if params is not None else
                       (self.autoscaler_params if same else {}))

    def with_controller(self, name: str, params: dict | None = None) -> "Scenario":
        same = name == self.controller
        return replace(self, controller=name,
                       controller_params=params if params is not None else
                       (self.controller_params if same else {}))

    @property
    def pd(self) -> tuple[int, int] | None:
        """The P/D layout of a single-ratio scenario (None: not P/D; see `ratios`)."""
        ratios = self.fleet.kv_roles if self.fleet is not None else ()
        return ratios[0] if len(ratios) == 1 else None

    @property
    def ratios(self) -> tuple[tuple[int, int], ...]:
        return self.fleet.kv_roles if self.fleet is not None else ()

    def with_ratio(self, ratio: tuple[int, int]) -> "Scenario":
        """This scenario on one of its P/D ratios."""
        return replace(self, fleet=replace(self.fleet, kv_roles=(ratio,)))

    def phases(self) -> list[Phase]:
        seqs, waiting = self.max_num_seqs, self.max_waiting
        users, rate = self.workload.num_concurrent_users, self.workload.arrival_rate
        faults = FaultsInForce()
        out, start, action = [], 0.0, None
        for nxt in [*self.timeline, None]:
            end = nxt.at if nxt is not None else self.duration
            if end > start:
                out.append(Phase(len(out), start, end, seqs, waiting, users, rate, action,
                                 faults.describe(), faults.slow, faults.modelled))
            if nxt is None:
                break
            seqs = nxt.capacity.get("max_num_seqs", seqs)
            waiting = nxt.capacity.get("max_waiting", waiting)
            users = nxt.load.get("num_concurrent_users", users)
            rate = nxt.load.get("arrival_rate", rate)
            if nxt.fault:
                faults.apply(nxt.fault)
            start, action = nxt.at, nxt
        return out

    @property
    def has_faults(self) -> bool:
        return any(a.fault for a in self.timeline)


class FaultsInForce:
    """Which faults hold after each action: a stall, a slowdown, injected errors, or the
    aftermath of a crash (until the next action)."""

    def __init__(self) -> None:
        self.stall = self.errors = self.crash = ""
        self.slow = 1.0

    def apply(self, fault: dict) -> None:
        kind, self.crash = fault["kind"], ""
        if kind == END:
            of = fault["of"]["kind"]
            if of == "stall":
                self.stall = ""
            elif of == "slow":
                self.slow = 1.0
            else:
                self.errors = ""
        elif kind == "stall":
            self.stall = describe_fault(fault)
        elif kind == "slow":
            self.slow = fault["factor"]
        elif kind == "errors":
            self.errors = describe_fault(fault)
        elif kind == "crash":  # a restarted engine has no stall or slowdown
            self.stall, self.slow, self.crash = "", 1.0, "after a crash"
        else:  # clear
            self.stall = self.errors = ""
            self.slow = 1.0

    @property
    def modelled(self) -> bool:
        return not (self.stall or self.errors or self.crash)

    def describe(self) -> str:
        slow = f"slow x{self.slow:g}" if self.slow != 1.0 else ""
        return ", ".join(p for p in (self.crash, self.stall, slow, self.errors) if p)


def _number(t: Table, name: str, what: str, low: float, high: float, default=None,
            open_low: bool = False):
    return t.get(name, float, f"{what} in {'(' if open_low else '['}{low:g}, {high:g}]", default,
                 ok=lambda v: (v > low if open_low else v >= low) and v <= high)


def _fault(t: Table) -> dict:
    """A `fault` table, checked against what the server accepts (its names and ranges)."""
    kinds = tuple(FAULT_KEYS)
    kind = t.get("kind", str, f"one of {', '.join(kinds)}", ok=lambda v: v in kinds)
    t.refuse_unknown(FAULT_KEYS[kind])
    fault: dict = {"kind": kind}
    seconds_required = kind == "stall"
    if "seconds" in FAULT_KEYS[kind]:
        seconds = _number(t, "seconds", "a number of modelled seconds", 0, MAX_FAULT_SECONDS,
                          None, open_low=seconds_required)
        if seconds is None and seconds_required:
            raise t.error("seconds", "a number of modelled seconds > 0 (how long the stall lasts)", None)
        if seconds:
            fault["seconds"] = seconds
    if "replica" in FAULT_KEYS[kind]:
        replica = t.get("replica", int, "an integer >= 0", None, ok=lambda v: v >= 0)
        if replica is not None:
            fault["replica"] = replica
    if kind == "slow":
        fault["factor"] = _number(t, "factor", "a number (step times x factor)", 0,
                                  MAX_SLOW_FACTOR, open_low=True)
    if kind == "errors":
        fault.update(_error_settings(t))
        if not set(fault) - {"kind", "seconds", "model"}:
            raise t.error("rate", f"one or more of {', '.join(ERROR_KEYS[1:])} (errors to inject)",
                          None)
    t.done()
    return fault


def _error_settings(t: Table) -> dict:
    out: dict = {}
    types_what = f"a non-empty list of error types ({', '.join(ERROR_TYPES)})"
    for name, value in (
            ("model", t.get("model", str, "a model name", None)),
            ("rate", _number(t, "rate", "a probability", 0, 1)),
            ("types", t.get("types", list, types_what, None,
                            ok=lambda v: v and all(x in ERROR_TYPES for x in v))),
            ("seed", t.get("seed", int, "an integer >= 0", None, ok=lambda v: 0 <= v < 2**63)),
            ("retry_after", _number(t, "retry_after", "a number of seconds", 0, 86_400)),
            ("retry_after_ms", t.get("retry_after_ms", int, "an integer of milliseconds in [0, 86400000]",
                                     None, ok=lambda v: 0 <= v <= 86_400_000)),
            ("should_retry", t.get("should_retry", bool, "true or false", None))):
        if value is not None:
            out[name] = value
    if "script" in t.data:
        t._known.append("script")
        raw = t.data["script"]
        if not isinstance(raw, list):
            raise t.error("script", "an array of { error = TYPE, count = N } tables", raw)
        steps = []
        for i, item in enumerate(raw):
            st = Table(item, t.where, f"{t.key('script')}[{i}]", ("error", "count"))
            error = st.get("error", str, f"one of {', '.join((*ERROR_TYPES, OK_STEP))}",
                           ok=lambda v: v in (*ERROR_TYPES, OK_STEP))
            count = st.get("count", int, "an integer in [1, 1000000]", 1,
                           ok=lambda v: 1 <= v <= 1_000_000)
            st.done()
            steps.append({"error": error, "count": count})
        out["script"] = steps
    return out


def _action(t: Table, duration: float) -> Action:
    at = t.get("at", float, f"a number of seconds in [0, duration = {duration}]",
               ok=lambda v: 0 <= v <= duration)
    cap, load = {}, {}
    if "capacity" in t.data:
        c = t.table("capacity", keys=_CAPACITY)
        for key in _CAPACITY:
            value = c.get(key, int, "an integer >= 1" if key == "max_num_seqs" else "an integer >= 0",
                          None, ok=(lambda v: v >= 1) if key == "max_num_seqs" else (lambda v: v >= 0))
            if value is not None:
                cap[key] = value
        c.done()
    if "load" in t.data:
        lt = t.table("load", keys=_LOAD_CHANGE)
        users = lt.get("num_concurrent_users", int, "an integer >= 0", None, ok=lambda v: v >= 0)
        rate = lt.get("arrival_rate", float, "a number >= 0", None, ok=lambda v: v >= 0)
        lt.done()
        if users is not None:
            load["num_concurrent_users"] = users
        if rate is not None:
            load["arrival_rate"] = rate
    fault = _fault(t.table("fault")) if "fault" in t.data else {}
    label = t.get("label", str, "a string", "")
    replicas = t.get("replicas", int, f"an integer in [0, {MAX_REPLICAS}]", None,
                     ok=lambda v: 0 <= v <= MAX_REPLICAS)
    t.done()
    if not cap and not load and not fault and replicas is None:
        raise t.error("capacity", "a `capacity`, `load`, `fault` table or `replicas` (an action "
                      "must change something)", None)
    return Action(at, cap, load, label, fault, replicas)


def _ends(action: Action, duration: float) -> list[Action]:
    """The implicit action that ends a fault given seconds (if it ends within the run)."""
    seconds = action.fault.get("seconds") if action.fault else None
    if not seconds or action.at + seconds >= duration:
        return []
    return [Action(action.at + seconds, fault={"kind": END, "of": action.fault},
                   label=f"{describe_fault(action.fault)} ends")]


def parse_scenario(doc: dict, where: str, base: Path | None = None) -> Scenario:
    top = Table(doc, where, "", _TOP)
    name = top.get("name", str, "a string", Path(where).stem)
    duration = top.get("duration", float, "a number of seconds > 0", ok=lambda v: v > 0)
    model = top.get("model", str, "a model name", "gpt-oss-20b")
    window = top.get("window", float, "a number of seconds > 0", 2.0, ok=lambda v: v > 0)
    description = top.get("description", str, "a string", "")

    st = top.table("server", None, keys=_SERVER)
    config = hardware = None
    seqs, waiting, scale, dp_size, offload = 256, 0, 1.0, 1, None
    if st is not None:
        config_text = st.get("config", str, "a path to a model TOML file or directory", None)
        if config_text is not None:
            config = (base / config_text) if base is not None else Path(config_text)
        hardware = st.get("hardware", str, "a hardware preset name", None)
        seqs = st.get("max_num_seqs", int, "an integer >= 1", 256, ok=lambda v: v >= 1)
        waiting = st.get("max_waiting", int, "an integer >= 0", 0, ok=lambda v: v >= 0)
        scale = st.get("time_scale", float, "a number > 0", 1.0, ok=lambda v: v > 0)
        dp_size = st.get("data_parallel_size", int, "an integer in [1, 64]", 1,
                         ok=lambda v: 1 <= v <= 64)
        offload = st.get("kv_offloading_size", float, "a number of GiB > 0 (absent: off)", None,
                         ok=lambda v: v > 0)
        st.done()

    lt = top.table("load")
    retry = lt.get("retry_after_529", float, "a number of seconds >= 0", 0.1, ok=lambda v: v >= 0)
    load = {k: v for k, v in lt.data.items() if k != "retry_after_529"}
    if load.get("arrival_pattern") != "trace":  # a trace ends with its last request
        load.setdefault("num_requests", UNBOUNDED_REQUESTS)
    workload = parse_workload({"workload": load}, where)
    if workload.arrival_pattern not in PATTERNS:
        raise lt.error("arrival_pattern", f"one of {', '.join(PATTERNS)} in a scenario",
                       workload.arrival_pattern)
    if workload.arrival_pattern == "trace":
        workload = resolve_trace(workload, base if base is not None else Path("."), where,
                                 "load.trace_path")

    controller, params, rtt = "fixed", {}, "e2e"
    ct = top.table("controller", None, keys=_CONTROLLER)
    if ct is not None:
        controller = ct.get("name", str, "a controller name", "fixed")
        rtt = ct.get("rtt", str, f"one of {', '.join(RTT_KINDS)}", "e2e", ok=lambda v: v in RTT_KINDS)
        params = dict(ct.get("params", dict, "a table of the controller's parameters", {}))
        ct.done()

    actions = []
    raw = doc.get("timeline", [])
    top._known.append("timeline")
    if not isinstance(raw, list):
        raise top.error("timeline", "an array of tables ([[timeline]])", raw)
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise ConfigError(where, f"timeline[{i}]", f"expected a table, got {item!r}")
        actions.append(_action(Table(item, where, f"timeline[{i}]", _ACTION), duration))
    actions += [end for action in actions for end in _ends(action, duration)]
    fleet, autoscaler, autoscaler_params, slo = _fleet_tables(top)
    scrape = _number(top, "scrape_interval", "a number of modelled seconds", 0, 3600, None,
                     open_low=True)
    if fleet is None and any(a.replicas is not None for a in actions):
        raise ConfigError(where, "timeline", "a `replicas` action needs a [fleet] table")
    if workload.arrival_pattern == "trace" and any(a.load for a in actions):
        raise ConfigError(where, "timeline", "a trace sets the load itself: no `load` actions")
    if fleet is not None and fleet.kv_roles:
        if autoscaler:
            raise ConfigError(where, "fleet.kv_roles", "a P/D fleet runs without an [autoscaler]")
        if any(a.replicas is not None for a in actions):
            raise ConfigError(where, "fleet.kv_roles", "a P/D fleet keeps its replicas: no "
                              "`replicas` actions on the timeline")
        if workload.pooling:
            raise ConfigError(where, "fleet.kv_roles", "a P/D fleet serves completions, not a "
                              "pooling load (load.pooling)")
    top.done()
    return Scenario(name=name, duration=duration, model=model, workload=workload,
                    controller=controller, controller_params=params, rtt=rtt,
                    retry_after_529=float(retry), window=window, description=description,
                    config=config, hardware=hardware or "b200", max_num_seqs=seqs,
                    max_waiting=waiting, time_scale=scale, data_parallel_size=dp_size,
                    kv_offloading_size=offload,
                    timeline=tuple(sorted(actions, key=lambda a: a.at)), path=where,
                    fleet=fleet, autoscaler=autoscaler, autoscaler_params=autoscaler_params,
                    slo=slo, scrape_interval=scrape)


def _fleet_tables(top: Table) -> tuple[FleetSpec | None, str, dict, SloSpec | None]:
    ft = top.table("fleet", None, keys=_FLEET)
    at = top.table("autoscaler", None, keys=_AUTOSCALER)
    st = top.table("slo", None, keys=_SLO)
    fleet = None
    if ft is not None or at is not None:
        ft = ft if ft is not None else Table({}, top.where, "fleet")
        max_replicas = ft.get("max_replicas", int, f"an integer in [1, {MAX_REPLICAS}]", 16,
                              ok=lambda v: 1 <= v <= MAX_REPLICAS)
        replicas = ft.get("replicas", int, f"an integer in [0, max_replicas = {max_replicas}]", 1,
                          ok=lambda v: 0 <= v <= max_replicas)
        delay = ft.data.get("startup_delay", "auto")
        ft._known.append("startup_delay")
        if not (delay == "auto" or (not isinstance(delay, bool) and isinstance(delay, (int, float))
                                    and 0 <= delay <= 3600)):
            raise ft.error("startup_delay", '"auto" or a number of seconds in [0, 3600]', delay)
        fleet = FleetSpec(
            replicas=replicas, max_replicas=max_replicas,
            startup_delay=delay if delay == "auto" else float(delay),
            gpus_per_replica=ft.get("gpus_per_replica", int, "an integer >= 1", None, ok=lambda v: v >= 1),
            poll_interval=_number(ft, "poll_interval", "seconds", 0, 60, 1.0, open_low=True),
            metrics_interval=_number(ft, "metrics_interval", "seconds", 0, 600, 15.0, open_low=True),
            metrics_delay=_number(ft, "metrics_delay", "seconds", 0, 600, 0.0),
            kv_roles=_kv_roles(ft, "replicas" in ft.data),
            pd_policy=ft.get("pd_policy", str, f"one of {', '.join(PD_POLICIES)}", "least_loaded",
                             ok=lambda v: v in PD_POLICIES))
        if fleet.kv_roles and "replicas" not in ft.data:  # the replicas the ratios add up to
            fleet = replace(fleet, replicas=sum(fleet.kv_roles[0]),
                            max_replicas=max(fleet.max_replicas, sum(fleet.kv_roles[0])))
        ft.done()
    name, params = "", {}
    if at is not None:
        name = at.get("name", str, "an autoscaler name (hpa, keda, slo, or package.module:Class)")
        params = dict(at.get("params", dict, "a table of the autoscaler's parameters", {}))
        at.done()
    slo = None
    if st is not None:
        bound = "a number of modelled seconds > 0"
        slo = SloSpec(ttft_s=_number(st, "ttft_s", bound, 0, 86_400, None, open_low=True),
                      e2e_s=_number(st, "e2e_s", bound, 0, 86_400, None, open_low=True),
                      attainment=_number(st, "attainment", "a share", 0, 1, 0.99, open_low=True),
                      window=_number(st, "window", "seconds", 0, 86_400, 300.0, open_low=True))
        if slo.ttft_s is None and slo.e2e_s is None:
            raise st.error("ttft_s", "ttft_s and/or e2e_s (the bounds of the SLO)", None)
        st.done()
    return fleet, name, params, slo


def _kv_roles(ft: Table, replicas_given: bool) -> tuple[tuple[int, int], ...]:
    """`kv_roles`: "P:D" or a non-empty list of them, each with P, D >= 1, all adding up to
    the same number of replicas (`replicas`, when given)."""
    if "kv_roles" not in ft.data:
        return ()
    ft._known.append("kv_roles")
    raw = ft.data["kv_roles"]
    what = ('"P:D" (P prefill and D decode replicas, each >= 1) or a non-empty list of them, '
            'all adding up to the same number of replicas')
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items:
        raise ft.error("kv_roles", what, raw)
    ratios = []
    for item in items:
        p, sep, d = item.partition(":") if isinstance(item, str) else ("", "", "")
        if not (sep and p.strip().isdigit() and d.strip().isdigit() and int(p) >= 1 and int(d) >= 1):
            raise ft.error("kv_roles", what, raw)
        ratios.append((int(p), int(d)))
    total = ft.data.get("replicas", sum(ratios[0])) if replicas_given else sum(ratios[0])
    if any(p + d != total for p, d in ratios) or len(set(ratios)) != len(ratios):
        raise ft.error("kv_roles", what + (f" (replicas = {total})" if replicas_given else "")
                       + ", none repeated", raw)
    return tuple(ratios)


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    return parse_scenario(read_toml(path), str(path), base=path.parent)
