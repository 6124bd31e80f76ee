"""Reading a few series of one model from a Prometheus text exposition.

Knows the text format through prometheus-client's parser (`text_string_to_metric_families`):
label values are unescaped and matched whole, so `model_name="m"` is the sample's
`model_name` label and nothing else (not `base_model_name`, not a value that only contains
it). Only the lines of the wanted series are handed to the parser (an engine's exposition
is mostly histogram buckets no caller here reads).

Does not know who scrapes, or when: the callers (the experiment runner's queue gauges and
P/D counters, the autoscalers' metric store) fetch the text and keep the numbers.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["model_sums"]


def model_sums(text: str, names: Iterable[str], model: str) -> dict[str, float]:
    """Each series of `names` whose `model_name` label is `model`, summed over its other
    labels (engine, finished_reason, reason, ...); a name with no such sample is absent.
    ValueError for a line the format does not allow."""
    wanted = frozenset(names)
    prefixes = tuple(f"{name}{sep}" for name in wanted for sep in ("{", " "))
    lines = [line for line in text.splitlines() if line.startswith(prefixes)]
    out: dict[str, float] = {}
    if not lines:
        return out
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            if sample.name in wanted and sample.labels.get("model_name") == model:
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out
