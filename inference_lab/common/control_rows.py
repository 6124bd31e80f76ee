"""The JSON rows of the control plane: one replica of /control/replicas, one model (or
data-parallel rank) of /control/capacity.

One home for what a client of the control plane reads, whichever lab answers: the
gateway fills them from the engine's messages (gateway.fleet, gateway.control), the
virtual-time lab from its replicas (experiments.virtual), the readiness from the fleet's
rules in both (engine.fleet.rules).

Does not know: where the numbers come from, HTTP, JSON encoders.
"""

from __future__ import annotations

__all__ = ["replica_row", "capacity_row"]


def replica_row(model: str, replica: int, port: int, starting: bool, draining: bool,
                ready_in_s: float, waiting: int, running: int, kv_role: str = "") -> dict:
    """A replica of /control/replicas: ready once neither starting nor draining;
    `kv_role` is its P/D role (null: none)."""
    return {"model": model, "replica": replica, "port": port,
            "ready": not (starting or draining), "starting": starting, "draining": draining,
            "ready_in_s": round(ready_in_s, 3), "waiting": waiting, "running": running,
            "kv_role": kv_role or None}


def capacity_row(model: str, max_waiting: int, max_num_seqs: int, waiting: int, running: int,
                 rank: int | None = None) -> dict:
    """A model of /control/capacity; data-parallel ranks behind one port name their rank."""
    return {"model": model, **({"rank": rank} if rank is not None else {}),
            "max_waiting": max_waiting, "max_num_seqs": max_num_seqs,
            "waiting": waiting, "running": running}
