"""An experiment's raw results: one row per request, the controller's limit and in-flight
at every change, the server's queue gauges every 250 ms, and the timeline's actions;
kept as one tuple per row while the run goes, turned into columns and written as Parquet.

Files in the run directory:
  requests.parquet    one row per request (columns in REQUEST_COLUMNS; a P/D run's + PD_COLUMNS)
  controller.parquet  t, limit, inflight            (limit: inf when there is none)
  server.parquet      t, waiting, running, max_num_seqs, max_waiting
  fleet.parquet       t, replicas (asked for), ready, starting, draining, desired (a fleet)
  scaling.parquet     t, from, to, added, detail (JSON: what the autoscaler saw)  (a fleet)
  actions.json        [{"t": when applied, "at": when due, "label": ..., "kind": "", "fault" or "fault_end"}],
                      plus run facts

Times are modelled seconds from the start of the run unless the name says otherwise
(`send_delay_ms`: wall milliseconds). Status: the HTTP status, 0 when the client's own
controller shed the request (never sent), -1 when no response came.

Knows pyarrow and the columns. Does not know how they are summarised.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from inference_lab.common.extras import require
from inference_lab.common.reading import loads, read_text

__all__ = ["Records", "REQUEST_COLUMNS", "load_run"]

REQUEST_COLUMNS = (
    "due_s",            # when the request was due (arrival; a closed-loop user ready to send)
    "send_s",           # when it was written (== due_s + the send delay, in modelled s)
    "send_delay_ms",    # wall ms from due to written: a late generator shows here
    "user",             # closed-loop user index; -1 for open-loop arrivals
    "phase",            # index of the timeline phase at send
    "limit",            # controller limit at send (inf = none)
    "inflight",         # controller in-flight at send, counting this request
    "status",           # HTTP status; 0 shed by the controller; -1 no response
    "prompt_tokens",    # as sent (a multi-turn prompt: the conversation so far + the new message)
    "cached_tokens",    # usage.prompt_tokens_details.cached_tokens (-1: no usage came)
    "adapter",          # the LoRA adapter the request named ("" = the base model)
    "max_tokens",
    "completion_tokens",
    "ttft_s",           # client-measured, modelled seconds (wall x time scale); nan if none
    "e2e_s",            # client-measured, modelled seconds
    "done_s",           # when the response ended
    "m_queue_s",        # the engine's modelled timings ("inference_lab"); nan if absent
    "m_ttft_s",
    "m_e2e_s",
    "preemptions",
    "error",
    "replica",          # the replica it was routed to (a fleet; -1 otherwise, or none ready)
)
PD_COLUMNS = (          # a P/D fleet's runs add (experiments.pd):
    "prefill_replica",  # the prefill replica of the request (-1: none)
    "prefill_e2e_s",    # client-measured, the first send to the prefill's answer; nan if none
    "prefill_m_e2e_s",  # the prefill replica's modelled e2e ("inference_lab"); nan if absent
)
CONTROLLER_COLUMNS = ("t", "limit", "inflight")
SERVER_COLUMNS = ("t", "waiting", "running", "max_num_seqs", "max_waiting")
FLEET_COLUMNS = ("t", "replicas", "ready", "starting", "draining", "desired")
SCALING_COLUMNS = ("t", "from", "to", "added", "detail")
NAN = math.nan


class Records:
    """While the run goes, one tuple per request and per controller change (one append, no
    arithmetic); the columns are built when read (`req`, `ctl`)."""

    def __init__(self) -> None:
        self._rows: list[tuple] = []  # (due, user, phase, limit, inflight, prompt, max_tokens, Result | None)
        self._trace: list[tuple] = []  # (monotonic, limit, inflight)
        self.srv: dict[str, list] = {name: [] for name in SERVER_COLUMNS}
        self.fleet_rows: dict[str, list] = {name: [] for name in FLEET_COLUMNS}
        self.scaling_rows: dict[str, list] = {name: [] for name in SCALING_COLUMNS}
        self.actions: list[dict] = []
        self.facts: dict = {}
        self.t0 = 0.0  # the run's start, time.monotonic()
        self.k = 1.0  # time scale: modelled seconds per wall second

    def start(self, unix_time: float, time_scale: float, t0: float = 0.0) -> None:
        """`t0`: the run's start on time.monotonic(), which every wall time passed in is on."""
        self.t0, self.k = t0, time_scale
        self.facts.update(started_unix=unix_time, time_scale=time_scale)

    def finish(self, t: float) -> None:
        self.facts["ended_s"] = t

    def controller(self, wall: float, limit: float, inflight: int) -> None:
        """The controller's state at time.monotonic() == wall."""
        self._trace.append((wall, limit, inflight))

    def server(self, t: float, gauges: dict[str, float]) -> None:
        for name in SERVER_COLUMNS:
            self.srv[name].append(t if name == "t" else gauges.get(name, NAN))

    def fleet(self, t: float, replicas: int, ready: int, starting: int, draining: int,
              desired: int) -> None:
        for name, value in zip(FLEET_COLUMNS, (t, replicas, ready, starting, draining, desired)):
            self.fleet_rows[name].append(value)

    def scaling(self, t: float, before: int, after: int, added: int, detail: dict) -> None:
        for name, value in zip(SCALING_COLUMNS, (t, before, after, added,
                                                 json.dumps(detail, default=str))):
            self.scaling_rows[name].append(value)

    def action(self, t: float, at: float, label: str, kind: str = "") -> None:
        self.actions.append({"t": t, "at": at, "label": label, "kind": kind})

    def request(self, due_wall: float, user: int, phase: int, limit: float, inflight: int,
                prompt, max_tokens: int, result) -> None:
        """A request that was sent (or failed to be): `prompt` is the
        experiments.prompts.Prompt sent, `result` its client.Result."""
        self._rows.append((due_wall, user, phase, limit, inflight, prompt, max_tokens, result))

    def shed(self, due_wall: float, phase: int, limit: float, inflight: int) -> None:
        """An arrival the controller refused: recorded, never sent."""
        self._rows.append((due_wall, -1, phase, limit, inflight, 0, 0, None))

    @property
    def ctl(self) -> dict[str, list]:
        t0, k = self.t0, self.k
        return {"t": [(wall - t0) * k for wall, _, _ in self._trace],
                "limit": [float(limit) for _, limit, _ in self._trace],
                "inflight": [inflight for _, _, inflight in self._trace]}

    @property
    def req(self) -> dict[str, list]:
        t0, k = self.t0, self.k
        cols: dict[str, list] = {name: [] for name in REQUEST_COLUMNS}
        appends = [cols[name].append for name in REQUEST_COLUMNS]
        (due_s, send_s, send_delay_ms, user_, phase_, limit_, inflight_, status, prompt_tokens,
         cached_tokens, adapter, max_tokens_, completion_tokens, ttft_s, e2e_s, done_s, m_queue_s,
         m_ttft_s, m_e2e_s, preemptions, error, replica_) = appends
        for due, user, phase, limit, inflight, prompt, max_tokens, result in self._rows:
            t = (due - t0) * k
            due_s(t)
            user_(user)
            phase_(phase)
            limit_(float(limit))
            inflight_(inflight)
            max_tokens_(max_tokens)
            if result is None:  # shed by the controller
                prompt_tokens(0)
                cached_tokens(-1)
                adapter("")
                send_s(t)
                send_delay_ms(0.0)
                status(0)
                completion_tokens(0)
                ttft_s(NAN)
                e2e_s(NAN)
                done_s(t)
                m_queue_s(NAN)
                m_ttft_s(NAN)
                m_e2e_s(NAN)
                preemptions(0)
                error("shed by the controller")
                replica_(-1)
                continue
            prompt_tokens(prompt.tokens)
            cached_tokens(result.cached_tokens)
            adapter(prompt.adapter)
            send_s((result.sent - t0) * k)
            send_delay_ms(max(0.0, result.sent - due) * 1000.0)
            status(result.status)
            completion_tokens(result.completion_tokens)
            ttft_s((result.first - result.sent) * k if result.first else NAN)
            e2e_s((result.done - result.sent) * k)
            done_s((result.done - t0) * k)
            m = result.modelled or {}
            m_queue_s(m.get("queue_time_s", NAN))
            m_ttft_s(m.get("ttft_s", NAN))
            m_e2e_s(m.get("e2e_s", NAN))
            preemptions(int(m.get("preemptions", 0)))
            error(result.error)
            replica_(result.replica)
        if "pd" in self.facts:
            cols["prefill_replica"] = [r.prefill_replica if r is not None else -1
                                       for *_, r in self._rows]
            cols["prefill_e2e_s"] = [(r.prefill_done - r.sent) * k if r is not None and r.prefill_done
                                     else NAN for *_, r in self._rows]
            cols["prefill_m_e2e_s"] = [(r.prefill_modelled or {}).get("e2e_s", NAN) if r is not None
                                       else NAN for *_, r in self._rows]
        return cols

    def write(self, out: Path) -> None:
        pa = require("pyarrow", "Parquet records need", "experiments")
        import pyarrow.parquet as pq

        out.mkdir(parents=True, exist_ok=True)
        tables = [("requests", self.req), ("controller", self.ctl), ("server", self.srv)]
        if self.fleet_rows["t"]:
            tables += [("fleet", self.fleet_rows), ("scaling", self.scaling_rows)]
        for name, cols in tables:
            if name == "scaling":
                schema = pa.schema([("t", pa.float64()), ("from", pa.int64()), ("to", pa.int64()),
                                    ("added", pa.int64()), ("detail", pa.string())])
                pq.write_table(pa.table(cols, schema=schema), out / f"{name}.parquet")
            else:
                pq.write_table(pa.table(cols), out / f"{name}.parquet")
        (out / "actions.json").write_text(json.dumps({"actions": self.actions, **self.facts}, indent=1))


class RunFileError(ValueError):
    """A run directory's file that cannot be read: one line naming it."""


def load_run(directory: Path) -> dict:
    """{"requests": columns, "controller": ..., "server": ..., "actions": [...], facts...}
    with each table as a dict of numpy arrays. A missing or unreadable file is a
    RunFileError naming it."""
    pq = require("pyarrow.parquet", "Parquet records need", "experiments")

    run: dict = {}
    for name in ("requests", "controller", "server", "fleet", "scaling"):
        path = directory / f"{name}.parquet"
        if name in ("fleet", "scaling") and not path.is_file():
            continue
        try:
            table = pq.read_table(path)
            run[name] = {col: table.column(col).to_numpy(zero_copy_only=False)
                         for col in table.column_names}
        except (OSError, ValueError) as exc:  # (pyarrow's errors: ArrowIOError, ArrowInvalid)
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RunFileError(f"{path}: not a readable Parquet table ({reason})") from None
    path = directory / "actions.json"
    actions = loads(read_text(path, RunFileError), str(path), RunFileError)
    if not isinstance(actions, dict):
        raise RunFileError(f"{path}: expected a JSON object")
    run.update(actions)
    return run
