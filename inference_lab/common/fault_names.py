"""The names of the faults a server can be asked for: the error types `/control/faults`
injects and the replica faults `/control/faults/replica` applies. One home for both
vocabularies, read by the gateway (which serves them) and by the experiment scenarios
(which schedule them and refuse a misspelt one at load).

Knows the names and the ranges of a replica fault's numbers. Does not know statuses, envelopes or what a fault does.
"""

from __future__ import annotations

__all__ = ["ERROR_TYPES", "OK_STEP", "REPLICA_FAULTS", "MAX_FAULT_SECONDS", "MAX_SLOW_FACTOR"]

ERROR_TYPES = ("rate_limit", "invalid_api_key", "context_length", "server_error", "overloaded",
               "model_not_found", "queue_saturated")
OK_STEP = "ok"  # a script step that lets requests through
REPLICA_FAULTS = ("crash", "stall", "slow", "clear")
MAX_FAULT_SECONDS = 86_400.0  # a stall's or a slowdown's longest duration
MAX_SLOW_FACTOR = 1000.0  # a slowdown multiplies step times by at most this
