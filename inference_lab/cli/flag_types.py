"""The flag types of every subcommand: one parser per kind of number and range, so a
bad value is refused the same way everywhere (`expected <what>, got <value>`), and
`refused_as` for the flags a library parses (its error becomes the flag's)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator

__all__ = ["number", "positive_int", "port", "seconds", "update_rate", "time_scale", "rate",
           "share", "refused_as"]


@contextlib.contextmanager
def refused_as(*errors: type[Exception]) -> Iterator[None]:
    """Inside an argparse `type=`: the `errors` a parser raises refuse the flag, with the
    parser's message."""
    try:
        yield
    except errors as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def number(kind: type, ok: Callable[[float], bool], what: str) -> Callable[[str], float]:
    """An argparse `type=` that reads a `kind` (int or float) and keeps it only if `ok`."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    parse.__name__ = what  # argparse names the type in its message
    return parse


positive_int = number(int, lambda v: v >= 1, "an integer >= 1")
port = number(int, lambda v: 0 <= v <= 65535, "a port in 0..65535")
seconds = number(float, lambda v: 0 <= v <= 86_400, "seconds in 0..86400")
update_rate = number(float, lambda v: v >= 0, "a number >= 0")
time_scale = number(float, lambda v: 0 < v <= 1000, "a number > 0 and <= 1000")
rate = number(float, lambda v: 0 < v <= 1, "a rate in (0, 1]")
share = number(float, lambda v: 0 < v <= 1, "a share in (0, 1]")
