"""Capacity: the two knobs that change live, their ranges, and when a queue refuses.

Knows the one rule for each: max_num_seqs is an integer from 1 to MAX_COUNT and at most
the model's max_num_batched_tokens; max_waiting an integer from 0 (unbounded) to
MAX_COUNT; a queue with max_waiting > 0 refuses once max_waiting requests wait. Every
place that takes a capacity value (the TOML config, `--max-waiting`, SetCapacity, the
test fake) checks it here. Does not know where a value came from: callers name it.
"""

from __future__ import annotations

from dataclasses import dataclass

from inference_lab.engine.sim.specs import MAX_COUNT

# What a value must be, as error messages say it.
EXPECTED = {"max_num_seqs": "an integer >= 1", "max_waiting": "an integer >= 0 (0 = unbounded)"}
_LOWEST = {"max_num_seqs": 1, "max_waiting": 0}


class CapacityError(ValueError):
    """An impossible capacity setting: `key` should be `expected`, was `value`."""

    def __init__(self, key: str, expected: str, value: object) -> None:
        self.key, self.expected, self.value = key, expected, value
        super().__init__(f"{key} must be {expected}, got {value}")


def out_of_range(key: str, value: int) -> str | None:
    """What `value` of knob `key` should have been, or None when it is in range."""
    if value < _LOWEST[key]:
        return EXPECTED[key]
    if value > MAX_COUNT:  # counts are reported as 32-bit unsigned (engine.proto)
        return f"at most {MAX_COUNT}"
    return None


def seqs_fit_budget(max_num_seqs: int, max_num_batched_tokens: int) -> bool:
    """Every running request must be able to decode in one step's token budget."""
    return max_num_seqs <= max_num_batched_tokens


def require_change(max_num_seqs: int | None, max_waiting: int | None) -> None:
    """A change names at least one knob."""
    if max_num_seqs is None and max_waiting is None:
        raise CapacityError("max_num_seqs or max_waiting", "given", "neither")


@dataclass(frozen=True, slots=True)
class Capacity:
    """One model's live capacity. Replaced whole on a change, never mutated."""

    max_num_seqs: int
    max_waiting: int  # 0 = unbounded

    def refuses(self, waiting: int) -> bool:
        """The saturation predicate: a new arrival is refused."""
        return 0 < self.max_waiting <= waiting

    def changed(self, max_num_batched_tokens: int, max_num_seqs: int | None = None,
                max_waiting: int | None = None) -> "Capacity":
        """This capacity with the given knobs changed (at least one), or CapacityError
        naming the first impossible one (nothing changes then)."""
        require_change(max_num_seqs, max_waiting)
        new = {"max_num_seqs": self.max_num_seqs if max_num_seqs is None else max_num_seqs,
               "max_waiting": self.max_waiting if max_waiting is None else max_waiting}
        for key, value in (("max_num_seqs", max_num_seqs), ("max_waiting", max_waiting)):
            if value is not None and (expected := out_of_range(key, value)) is not None:
                raise CapacityError(key, expected, value)
        if not seqs_fit_budget(new["max_num_seqs"], max_num_batched_tokens):
            raise CapacityError("max_num_seqs",
                                f"at most max_num_batched_tokens ({max_num_batched_tokens})",
                                new["max_num_seqs"])
        return Capacity(**new)
