"""An experiment's raw results: one row per request, the controller's limit and in-flight
at every change, the server's queue gauges every 250 ms, and the timeline's actions;
kept as column lists while the run goes (an append per field), written as Parquet.

Files in the run directory:
  requests.parquet    one row per request (columns in REQUEST_COLUMNS)
  controller.parquet  t, limit, inflight            (limit: inf when there is none)
  server.parquet      t, waiting, running, max_num_seqs, max_waiting
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
)
CONTROLLER_COLUMNS = ("t", "limit", "inflight")
SERVER_COLUMNS = ("t", "waiting", "running", "max_num_seqs", "max_waiting")
NAN = math.nan


class Records:
    def __init__(self) -> None:
        self.req: dict[str, list] = {name: [] for name in REQUEST_COLUMNS}
        self.ctl: dict[str, list] = {name: [] for name in CONTROLLER_COLUMNS}
        self.srv: dict[str, list] = {name: [] for name in SERVER_COLUMNS}
        self.actions: list[dict] = []
        self.facts: dict = {}

    def start(self, unix_time: float, time_scale: float) -> None:
        self.facts.update(started_unix=unix_time, time_scale=time_scale)

    def finish(self, t: float) -> None:
        self.facts["ended_s"] = t

    def controller(self, t: float, limit: float, inflight: int) -> None:
        c = self.ctl
        c["t"].append(t)
        c["limit"].append(float(limit))
        c["inflight"].append(inflight)

    def server(self, t: float, gauges: dict[str, float]) -> None:
        for name in SERVER_COLUMNS:
            self.srv[name].append(t if name == "t" else gauges.get(name, NAN))

    def action(self, t: float, at: float, label: str, kind: str = "") -> None:
        self.actions.append({"t": t, "at": at, "label": label, "kind": kind})

    def request(self, run, due_wall: float, user: int, phase: int, limit: float, inflight: int,
                prompt, max_tokens: int, result) -> None:
        """`prompt`: the experiments.prompts.Prompt sent."""
        k, t0 = run.k, run.t0
        r = self.req
        r["due_s"].append((due_wall - t0) * k)
        r["send_s"].append((result.sent - t0) * k)
        r["send_delay_ms"].append(max(0.0, result.sent - due_wall) * 1000.0)
        r["user"].append(user)
        r["phase"].append(phase)
        r["limit"].append(float(limit))
        r["inflight"].append(inflight)
        r["status"].append(result.status)
        r["prompt_tokens"].append(prompt.tokens)
        r["cached_tokens"].append(result.cached_tokens)
        r["adapter"].append(prompt.adapter)
        r["max_tokens"].append(max_tokens)
        r["completion_tokens"].append(result.completion_tokens)
        r["ttft_s"].append((result.first - result.sent) * k if result.first else NAN)
        r["e2e_s"].append((result.done - result.sent) * k)
        r["done_s"].append((result.done - t0) * k)
        m = result.modelled or {}
        r["m_queue_s"].append(m.get("queue_time_s", NAN))
        r["m_ttft_s"].append(m.get("ttft_s", NAN))
        r["m_e2e_s"].append(m.get("e2e_s", NAN))
        r["preemptions"].append(int(m.get("preemptions", 0)))
        r["error"].append(result.error)

    def shed(self, run, due_wall: float, phase: int) -> None:
        """An arrival the controller refused: recorded, never sent."""
        t = (due_wall - run.t0) * run.k
        r = self.req
        for name, value in (("due_s", t), ("send_s", t), ("send_delay_ms", 0.0), ("user", -1),
                            ("phase", phase), ("limit", float(run.ctl.limit)),
                            ("inflight", run.ctl.inflight), ("status", 0), ("prompt_tokens", 0),
                            ("cached_tokens", -1), ("adapter", ""), ("max_tokens", 0), ("completion_tokens", 0), ("ttft_s", NAN),
                            ("e2e_s", NAN), ("done_s", t), ("m_queue_s", NAN), ("m_ttft_s", NAN),
                            ("m_e2e_s", NAN), ("preemptions", 0), ("error", "shed by the controller")):
            r[name].append(value)

    def write(self, out: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        out.mkdir(parents=True, exist_ok=True)
        for name, cols in (("requests", self.req), ("controller", self.ctl), ("server", self.srv)):
            pq.write_table(pa.table(cols), out / f"{name}.parquet")
        (out / "actions.json").write_text(json.dumps({"actions": self.actions, **self.facts}, indent=1))


def load_run(directory: Path) -> dict:
    """{"requests": columns, "controller": ..., "server": ..., "actions": [...], facts...}
    with each table as a dict of numpy arrays."""
    import pyarrow.parquet as pq

    run: dict = {}
    for name in ("requests", "controller", "server"):
        table = pq.read_table(directory / f"{name}.parquet")
        run[name] = {col: table.column(col).to_numpy(zero_copy_only=False) for col in table.column_names}
    run.update(json.loads((directory / "actions.json").read_text()))
    return run
