"""A full queue's refusal is recognised by the status and the error message a profile
answers with, in one place (experiments.outcomes)."""

from __future__ import annotations

import numpy as np

from inference_lab.common.error_table import SATURATED_SPECS, anthropic_envelope, openai_envelope
from inference_lab.experiments.outcomes import is_refusal, refused

QUEUE_FULL = openai_envelope(SATURATED_SPECS[503], "The request queue is full.").decode()
INJECTED = openai_envelope(SATURATED_SPECS[503],
                           "The server is overloaded, please try again later. (injected fault)").decode()


def test_a_529_is_a_refusal_whatever_its_body():
    assert is_refusal(529, "") and is_refusal(529, "not json")


def test_sglangs_queue_full_503_is_a_refusal_in_either_envelope():
    assert is_refusal(503, QUEUE_FULL)
    assert is_refusal(503, anthropic_envelope(SATURATED_SPECS[503], "The request queue is full."))


def test_any_other_503_is_not_a_refusal():
    assert not is_refusal(503, INJECTED)
    assert not is_refusal(503, "")
    assert not is_refusal(503, "no ready replica")
    assert not is_refusal(503, '{"error": "The request queue is full."}')


def test_the_queue_full_message_under_another_status_is_not_a_refusal():
    assert not is_refusal(500, QUEUE_FULL) and not is_refusal(200, QUEUE_FULL)


def test_the_column_rule_agrees_with_the_one_response_rule():
    status = np.array([200, 503, 503, 529, 0, -1, 503])
    error = np.array(["", QUEUE_FULL, INJECTED, "", "shed by the controller", "reset", ""],
                     dtype=object)
    assert refused(status, error).tolist() == [False, True, False, True, False, False, False]
    assert refused(status, error).tolist() == [is_refusal(int(s), e) for s, e in zip(status, error)]
