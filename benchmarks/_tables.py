"""The tables of BENCHMARKS.md that a script refreshes: rendering and replacing them.

A refreshable table sits between two markers on lines of their own,

    <!-- bench:NAME -->
    ...
    <!-- /bench:NAME -->

and `replace_block` swaps what is between them for a new body, leaving every other byte of
the file as it was. `render` makes that body: a table of figures (what, figure, target,
met) and one line saying how to reproduce it and where it was measured. Knows nothing of
the benchmarks themselves (benchmarks/_registry.py holds the registry) and runs nothing.
`ms`, `pct`, `span` and `within` write a figure the way every table writes it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_OPEN = "<!-- bench:{} -->"
_CLOSE = "<!-- /bench:{} -->"
_ANY = re.compile(r"^<!-- (/?)bench:([A-Za-z0-9_.-]+) -->[ \t]*$", re.MULTILINE)


class MarkerError(ValueError):
    """A block's markers are missing, repeated or out of order."""


@dataclass(frozen=True, slots=True)
class Row:
    what: str
    figure: str
    target: str = "none"
    met: bool | None = None  # None: no target, or not decidable from the figures


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def render(rows: list[Row], *, commands: list[str], commit: str, machine: str) -> str:
    """The body of a block: the table, then the commands, the commit and the machine."""
    lines = ["| what | figure | target | met |", "|---|---|---|---|"]
    for r in rows:
        met = "" if r.met is None else "yes" if r.met else "**no**"
        lines.append(f"| {_cell(r.what)} | {_cell(r.figure)} | {_cell(r.target)} | {met} |")
    shown = "; ".join(f"`{c}`" for c in commands)
    lines += ["", f"Command: {shown}. Measured at `{commit}` on {machine}."]
    return "\n".join(lines)


def block_names(text: str) -> list[str]:
    """The names of the blocks in `text`, in order (each checked for a matching close)."""
    names, open_name = [], None
    for m in _ANY.finditer(text):
        closing, name = m.group(1) == "/", m.group(2)
        if not closing:
            if open_name is not None:
                raise MarkerError(f"block {open_name!r} is not closed before {name!r} opens")
            open_name = name
        else:
            if open_name != name:
                raise MarkerError(f"close of {name!r} without its open")
            names.append(name)
            open_name = None
    if open_name is not None:
        raise MarkerError(f"block {open_name!r} is not closed")
    return names


def replace_block(text: str, name: str, body: str) -> str:
    """`text` with the lines between NAME's markers replaced by `body`; the rest unchanged."""
    count = block_names(text).count(name)
    if count != 1:
        raise MarkerError(f"block {name!r} is in the file {count} times, expected once "
                          f"({_OPEN.format(name)} ... {_CLOSE.format(name)}, each on a line "
                          "of its own)")
    start = re.search(rf"^{re.escape(_OPEN.format(name))}[ \t]*\n", text, re.MULTILINE)
    end = re.search(rf"^{re.escape(_CLOSE.format(name))}", text, re.MULTILINE)
    return f"{text[:start.end()]}{body.strip(chr(10))}\n{text[end.start():]}"


# ---- figures ---------------------------------------------------------------------------------------
def ms(seconds: float, digits: int = 1) -> str:
    return "n/a" if seconds is None or math.isnan(seconds) else f"{seconds * 1e3:.{digits}f}"


def pct(a: float, b: float) -> str:
    return "n/a" if not b or math.isnan(a) or math.isnan(b) else f"{100 * (a / b - 1):+.1f} %"


def span(values: list[float], fmt: str = "{:,.0f}") -> str:
    """"a" when every value formats the same, else "least–greatest"."""
    if not values:
        return "n/a"
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}–{hi}"


def within(a: float, b: float, tolerance: float) -> bool | None:
    if not b or math.isnan(a) or math.isnan(b):
        return None
    return abs(a / b - 1) <= tolerance
