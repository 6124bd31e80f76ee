"""A scenario's `[server]` table: what to serve and how (experiments.scenario reads it),
and the `serve` flags that say which engine a private server imitates.

    [server]
    config = "../gpt-oss-20b.toml"      # relative to the scenario; default: the embedded model
    hardware = "b200"
    max_num_seqs = 256                  # set through /control/capacity at the start
    max_waiting = 0                     # vLLM's queue bound (0: unbounded)
    time_scale = 1.0                    # --time-scale overrides
    data_parallel_size = 1              # ranks per replica (--virtual only)
    kv_offloading_size = 256            # GiB of host KV tier per replica (absent: off)
    engine = "sglang"                   # the engine imitated: vllm (default) | sglang
    max_queued_requests = 64            # sglang's queue bound (absent: unbounded)

With `engine = "sglang"` the server runs SGLang's profile (docs/engines.md): served, as
`serve --engine sglang`; in virtual time and in the oracle, on the same profile. Its queue
bound is `max_queued_requests` (SGLang's flag), which is the scenario's `max_waiting` in
every other respect (the capacity set at the start, the oracle's refusals); `max_waiting`
is refused beside it, as `serve` refuses `--max-waiting` with `--engine sglang`.

Knows: the table's keys and checks (errors name the file and key). Does not know HTTP.
"""

from __future__ import annotations

from pathlib import Path

from inference_lab.common.toml import Table

__all__ = ["ENGINES", "SERVER_KEYS", "parse_server", "engine_flags"]

ENGINES = ("vllm", "sglang")  # as serve's --engine
SERVER_KEYS = ("config", "hardware", "max_num_seqs", "max_waiting", "time_scale",
               "data_parallel_size", "kv_offloading_size", "engine", "max_queued_requests")


def parse_server(top: Table, base: Path | None) -> dict:
    """The Scenario's fields from the `[server]` table of `top` (defaults without one)."""
    out = {"config": None, "hardware": "b200", "max_num_seqs": 256, "max_waiting": 0,
           "time_scale": 1.0, "data_parallel_size": 1, "kv_offloading_size": None,
           "engine": "vllm"}
    st = top.table("server", None, keys=SERVER_KEYS)
    if st is None:
        return out
    config_text = st.get("config", str, "a path to a model TOML file or directory", None)
    if config_text is not None:
        out["config"] = (base / config_text) if base is not None else Path(config_text)
    out["hardware"] = st.get("hardware", str, "a hardware preset name", None) or "b200"
    out["max_num_seqs"] = st.get("max_num_seqs", int, "an integer >= 1", 256, ok=lambda v: v >= 1)
    out["time_scale"] = st.get("time_scale", float, "a number > 0", 1.0, ok=lambda v: v > 0)
    out["data_parallel_size"] = st.get("data_parallel_size", int, "an integer in [1, 64]", 1,
                                       ok=lambda v: 1 <= v <= 64)
    out["kv_offloading_size"] = st.get("kv_offloading_size", float,
                                       "a number of GiB > 0 (absent: off)", None, ok=lambda v: v > 0)
    engine = out["engine"] = st.get("engine", str, f"one of {', '.join(ENGINES)}", "vllm",
                                    ok=lambda v: v in ENGINES)
    if engine == "sglang":
        if "max_waiting" in st.data:
            raise st.error("max_waiting", 'no max_waiting with engine = "sglang" (its queue '
                           "bound is max_queued_requests)", st.data["max_waiting"])
        out["max_waiting"] = st.get("max_queued_requests", int,
                                    "an integer >= 1 (absent: unbounded)", 0, ok=lambda v: v >= 1)
    else:
        if "max_queued_requests" in st.data:
            raise st.error("max_queued_requests", 'engine = "sglang" beside it (SGLang\'s queue '
                           "bound; vLLM's is max_waiting)", st.data["max_queued_requests"])
        out["max_waiting"] = st.get("max_waiting", int, "an integer >= 0", 0, ok=lambda v: v >= 0)
    st.done()
    return out


def engine_flags(engine: str, max_waiting: int) -> list[str]:
    """The `serve` flags of the engine imitated and its queue bound (`max_waiting`: the
    scenario's bound, 0 = unbounded)."""
    if engine == "sglang":
        bound = ["--max-queued-requests", str(max_waiting)] if max_waiting else []
        return ["--engine", "sglang", *bound]
    return ["--max-waiting", str(max_waiting)]
