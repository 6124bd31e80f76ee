"""What an experiment's response says about the server's load: the one home of the rule
that turns a response's (HTTP status, error body) into an outcome, read by the load's
controller samples (experiments.load), the summary, the fleet summary and the report.

A refusal is what an engine profile answers for a full queue (engine.sim.profiles): the
lab's 529 (vLLM's profile), or SGLang's 503 whose error message is "The request queue is
full.". Any other 503 (an injected fault, no ready replica, an engine restarting) stays
an error: a status alone does not say the queue was full.

Knows the profiles' refusal answers and the OpenAI and Anthropic error envelopes. Does not
know the controllers' rules, the records' files or how a run is summarised.
"""

from __future__ import annotations

import msgspec
import numpy as np

from inference_lab.engine.sim.profiles import PROFILES

__all__ = ["REFUSAL_STATUS", "is_refusal", "refused"]

REFUSAL_STATUS = 529  # the lab's own full-queue refusal: always a refusal, whatever its body
# (status, message) of each profile whose full queue answers with its own text
_PROFILE_REFUSALS = frozenset((p.saturated_status, p.refusal_message)
                              for p in PROFILES.values() if p.refusal_message)
_REFUSAL_STATUSES = frozenset(status for status, _ in _PROFILE_REFUSALS)
_decode = msgspec.json.Decoder().decode


def _message(body: str | bytes) -> str | None:
    """The error message of an OpenAI (`{"error": {"message"}}`) or Anthropic
    (`{"type": "error", "error": {"message"}}`) envelope; None for any other body."""
    try:
        doc = _decode(body)
    except (msgspec.DecodeError, TypeError):
        return None
    error = doc.get("error") if isinstance(doc, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else None


def is_refusal(status: int, body: str | bytes) -> bool:
    """Whether a response (its status and its error body) is a full queue's refusal."""
    if status == REFUSAL_STATUS:
        return True
    if status not in _REFUSAL_STATUSES:
        return False
    return (status, _message(body)) in _PROFILE_REFUSALS


def refused(status: np.ndarray, error: np.ndarray) -> np.ndarray:
    """The refusals among a run's requests (its `status` and `error` columns)."""
    mask = status == REFUSAL_STATUS
    for i in np.flatnonzero(np.isin(status, list(_REFUSAL_STATUSES))):
        mask[i] = is_refusal(int(status[i]), error[i])
    return mask
