"""Prometheus text exposition at the cost of one string format per family.

Knows prometheus-client's text format: the HELP and TYPE lines of a family and the text of
each sample (name and labels) are rendered once by prometheus-client (`split_families` of
its `generate_latest`); a scrape only puts the numbers back (`Lines.fill`), with
prometheus-client's own float formatting (`floatToGoString`). A histogram is kept as plain
numbers (`Hist`: a list of bucket counts, one bisect per observation); its lines
(`HistLines`) are formatted in one `%` operation (bucket counts below 10^6 as `%d.0`,
exactly what floatToGoString gives for them) and kept until it changes.

Does not know: which series a service exports (engine.metrics, gateway.metrics).
Safe to read from a thread other than the writer's: a histogram's counts are copied in
one C call, and a render keyed on numbers read before the copy is at worst redone.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate

from prometheus_client import generate_latest
from prometheus_client.utils import floatToGoString

fmt = floatToGoString
_GO_EXPONENT = 1_000_000  # from here floatToGoString writes an exponent (1e+06)


class _Families:
    """A collector of ready-made metric families (what generate_latest walks)."""

    def __init__(self, families) -> None:
        self.families = families

    def collect(self):
        return self.families


def render(families) -> bytes:
    """prometheus_client's own text exposition of these metric families."""
    return generate_latest(_Families(families))


def split_families(text: str) -> list[tuple[str, list[str]]]:
    """prometheus-client's text as (HELP and TYPE lines, sample texts without their
    number: `name{labels} `) per family, in order."""
    families: list[tuple[str, list[str]]] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("# HELP"):
            families.append((line, []))
        elif line.startswith("#"):
            header, samples = families[-1]
            families[-1] = (header + line, samples)
        else:
            families[-1][1].append(line.rsplit(" ", 1)[0] + " ")
    return families


def merge_expositions(texts: list[bytes]) -> bytes:
    """Several processes' expositions of the same families as one (their samples told
    apart by their labels, e.g. vLLM's `engine`): each family once, with the first
    text's HELP and TYPE lines, then every text's samples of it in turn; a family only
    some texts have is kept where it first appears."""
    if len(texts) == 1:
        return texts[0]
    order: list[str] = []
    heads: dict[str, str] = {}
    samples: dict[str, list[str]] = {}
    for text in texts:
        current = None
        for line in text.decode().splitlines(keepends=True):
            if line.startswith("# HELP "):
                current = line.split(" ", 3)[2]
                if current not in heads:
                    order.append(current)
                    heads[current] = line
                    samples[current] = []
                    fresh = True
                else:
                    fresh = False
            elif line.startswith("#"):
                if current is not None and fresh:
                    heads[current] += line
            elif current is not None and line.strip():
                samples[current].append(line)
    return "".join(heads[name] + "".join(samples[name]) for name in order).encode()


def _template(prefixes: list[str], number: str) -> str:
    return "".join(p.replace("%", "%%") + number + "\n" for p in prefixes)


class Lines:
    """Some sample lines with their numbers left out; `fill(values)` writes them."""

    __slots__ = ("template", "size")

    def __init__(self, prefixes: list[str]) -> None:
        self.template = _template(prefixes, "%s")
        self.size = len(prefixes)

    def fill(self, values) -> str:
        return self.template % tuple(map(fmt, values))


class Hist:
    """A histogram as plain numbers: counts per bucket (the last is +Inf), their total and
    the sum of the observations."""

    __slots__ = ("bounds", "counts", "sum", "n")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.n = 0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += n  # le: value <= bound
        self.sum += value * n
        self.n += n

    def cumulative(self) -> tuple[list[int], float]:
        """(cumulative counts, sum): a copy (the writer may go on meanwhile)."""
        total = self.sum
        return list(accumulate(self.counts)), total


class HistLines:
    """A histogram's sample lines (buckets, _count, _sum, as prometheus-client orders
    them), formatted in one operation and cached while the histogram is unchanged."""

    __slots__ = ("hist", "counts_template", "any_template", "key", "text")

    def __init__(self, hist: Hist, prefixes: list[str]) -> None:
        assert len(prefixes) == len(hist.counts) + 2, "buckets, _count and _sum"
        self.hist = hist
        self.counts_template = _template(prefixes[:-1], "%d.0") + _template(prefixes[-1:], "%s")
        self.any_template = _template(prefixes, "%s")
        self.key: tuple = ()
        self.text = ""

    def render(self) -> str:
        h = self.hist
        key = (h.n, h.sum)  # read before the copy: a change meanwhile renders again next time
        if key != self.key:
            counts = list(accumulate(h.counts))
            total = counts[-1]
            if total < _GO_EXPONENT:
                self.text = self.counts_template % (*counts, total, fmt(h.sum))
            else:
                self.text = self.any_template % (*map(fmt, counts), fmt(total), fmt(h.sum))
            self.key = key
        return self.text
