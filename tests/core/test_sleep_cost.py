"""Sleep mode's arithmetic (engine.fleet.sleep): waking restores the weights over the host
link, the KV cache for nothing, and knows only vLLM's two memory tags."""

from __future__ import annotations

import pytest

from inference_lab.engine.fleet.sleep import check_tags, wake_seconds

from factories import deployment


def test_waking_the_weights_costs_their_bytes_over_the_host_link_of_tp_gpus():
    # gpt-oss-20b: 13,150,126,080 B of resident weights (its preset), B200 at 64 GB/s
    assert wake_seconds(deployment()) == pytest.approx(13_150_126_080 / 64e9)
    assert wake_seconds(deployment(tp=2)) == pytest.approx(13_150_126_080 / 64e9 / 2)
    assert wake_seconds(deployment(), {"kv_cache"}) == 0.0  # re-allocating the KV cache


def test_a_wake_names_vllms_tags_or_all_of_them():
    assert check_tags([]) == {"weights", "kv_cache"}
    assert check_tags(["weights"]) == {"weights"}
    with pytest.raises(ValueError, match="unknown tag 'gpu'"):
        check_tags(["gpu"])
