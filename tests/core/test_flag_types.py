"""The one set of numeric flag types: values in range pass, others are refused by name."""

import argparse

import pytest

from inference_lab.cli.flag_types import port, positive_int, seconds, time_scale, update_rate


@pytest.mark.parametrize("kind, text, value", [
    (positive_int, "3", 3), (port, "0", 0), (port, "65535", 65535), (seconds, "0.5", 0.5),
    (update_rate, "0", 0.0), (time_scale, "1000", 1000.0),
])
def test_values_in_range_are_read(kind, text, value):
    assert kind(text) == value and type(kind(text)) is type(value)


@pytest.mark.parametrize("kind, text, message", [
    (positive_int, "0", "expected an integer >= 1, got '0'"),
    (positive_int, "1.5", "expected an integer >= 1, got '1.5'"),
    (port, "65536", "expected a port in 0..65535, got '65536'"),
    (seconds, "nan", "expected seconds in 0..86400, got 'nan'"),
    (update_rate, "-1", "expected a number >= 0, got '-1'"),
    (time_scale, "0", "expected a number > 0 and <= 1000, got '0'"),
])
def test_values_out_of_range_are_refused_with_what_was_expected(kind, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        kind(text)
