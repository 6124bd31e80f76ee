"""The modelled start-up delay of a replica (engine.fleet.startup): resident weight bytes
over the preset's load bandwidth on tp GPUs in parallel, plus the fixed engine start-up."""

import pytest

from factories import deployment
from inference_lab.engine.fleet.startup import (
    FIXED_STARTUP_S, auto_startup_delay, parse_startup_delay, startup_delay,
)


def test_auto_loads_gpt_oss_20b_on_one_b200_in_a_fifth_of_a_second_after_the_fixed_part():
    # 19,110,297,600 fp4 expert params * 0.5 B + 1,797,488,640 bf16 params * 2 B
    # = 9,555,148,800 + 3,594,977,280 = 13,150,126,080 B; over 64 GB/s (PCIe Gen5 x16):
    # 0.20547 s
    assert auto_startup_delay(deployment()) == pytest.approx(FIXED_STARTUP_S + 0.20547, abs=1e-5)


def test_tensor_parallel_gpus_load_their_shards_at_once_and_a_slower_link_takes_longer():
    one = auto_startup_delay(deployment("llama-3.1-70b", "h100", tp=1)) - FIXED_STARTUP_S
    four = auto_startup_delay(deployment("llama-3.1-70b", "h100", tp=4)) - FIXED_STARTUP_S
    assert four == pytest.approx(one / 4)
    a100 = auto_startup_delay(deployment("llama-3.1-70b", "a100", tp=1)) - FIXED_STARTUP_S
    assert a100 == pytest.approx(one * 2)  # PCIe Gen4 x16: half of Gen5's 64 GB/s


def test_a_number_is_used_as_given_and_bad_settings_name_what_was_wrong():
    assert parse_startup_delay("auto") == "auto" and parse_startup_delay(" AUTO ") == "auto"
    assert startup_delay(deployment(), parse_startup_delay("2.5")) == 2.5
    assert startup_delay(deployment(), 0.0) == 0.0
    for bad in ("-1", "soon", "nan", "inf"):
        with pytest.raises(ValueError, match="seconds"):
            parse_startup_delay(bad)
