"""BENCHMARKS.md's refreshable tables: a block is rewritten between its markers and nothing
else in the file moves; a missing or broken marker fails loudly instead of writing."""

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


def load(name: str):
    """A module of benchmarks/ as its scripts import each other: by name, from that folder."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module(name)


tables = load("_tables")

SAMPLE = """# Results

Prose before, kept | as is.

<!-- bench:alpha -->
| what | figure | target | met |
|---|---|---|---|
| old | 1 | none | |
<!-- /bench:alpha -->

Why alpha is what it is.

<!-- bench:beta -->
old beta
<!-- /bench:beta -->
trailing text without a newline at the end"""


def test_a_block_is_replaced_and_everything_else_is_kept_byte_for_byte():
    body = tables.render([tables.Row("tokens/s", "16,000", "≥ 15,000", True),
                          tables.Row("p99", "1.2 | 1.3 ms")],
                         commands=["python benchmarks/x.py --n 3"], commit="abc1234",
                         machine="2 CPUs (test)")
    out = tables.replace_block(SAMPLE, "alpha", body)

    before, after = SAMPLE.split("<!-- bench:alpha -->\n")[0], SAMPLE.split("<!-- /bench:alpha -->")[1]
    assert out.startswith(before + "<!-- bench:alpha -->\n" + body + "\n<!-- /bench:alpha -->")
    assert out.endswith("<!-- /bench:alpha -->" + after)
    assert "| old | 1 |" not in out
    # a pipe inside a cell is escaped, the met column says yes / nothing
    assert "| tokens/s | 16,000 | ≥ 15,000 | yes |" in out
    assert "| p99 | 1.2 \\| 1.3 ms | none |  |" in out
    assert "Command: `python benchmarks/x.py --n 3`. Measured at `abc1234` on 2 CPUs (test)." in out
    # the other block is untouched, and replacing it again leaves alpha as it now is
    again = tables.replace_block(out, "beta", "new beta")
    assert again.replace("new beta", "old beta") == out


def test_replacing_twice_with_the_same_body_changes_nothing():
    once = tables.replace_block(SAMPLE, "beta", "x\n")
    assert tables.replace_block(once, "beta", "x") == once


def test_a_missing_block_fails_and_names_its_markers():
    with pytest.raises(tables.MarkerError, match="<!-- bench:gamma -->"):
        tables.replace_block(SAMPLE, "gamma", "body")


def test_a_block_without_its_close_or_twice_in_the_file_fails():
    with pytest.raises(tables.MarkerError, match="not closed"):
        tables.replace_block(SAMPLE.replace("<!-- /bench:beta -->", ""), "alpha", "body")
    with pytest.raises(tables.MarkerError, match="2 times"):
        tables.replace_block(SAMPLE + "\n<!-- bench:alpha -->\n<!-- /bench:alpha -->\n",
                             "alpha", "body")
    with pytest.raises(tables.MarkerError, match="without its open"):
        tables.block_names("<!-- /bench:alpha -->\n")


def test_a_marker_inside_a_line_is_not_a_marker():
    with pytest.raises(tables.MarkerError, match="0 times"):
        tables.replace_block("see `<!-- bench:alpha -->` here\n", "alpha", "body")



def test_every_registered_benchmark_has_one_block_in_benchmarks_md():
    run_all = load("run_all")
    names = tables.block_names((ROOT / "BENCHMARKS.md").read_text())
    registered = [bench.name for bench in run_all.REGISTRY]
    assert len(set(registered)) == len(registered)
    assert sorted(names) == sorted(registered)
