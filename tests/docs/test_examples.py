"""The README and docs/*.md, as a reader meets them: every shell and Python example runs
against a real `inference-lab serve` (or `engine`, `gateway`) on free loopback ports and
does what the page says, every block that cannot run is marked so and counted, every
relative link lands on a file and heading that exist, and the pages speak of the project
only. How a block is run: `docs_examples`."""

from __future__ import annotations

import http.server
import re
import shutil
import threading

import pytest

from docs_examples import PARSE, ROOT, RUN, SHOW, Page, blocks, pages

# Blocks marked `no-run` on each page: changing one is a decision, so it is pinned here.
NO_RUN = {
    "README.md": 1,              # pip install and the test suite itself
    "docs/calibrate.md": 2,      # a fit of your own measurements, then serving it
    "docs/calibration.md": 1,    # the fit: minutes of simulation
    "docs/configuration.md": 1,  # needs a checkout of the Rust project's catalog
    "docs/experiments.md": 3,    # experiments of a modelled minute and more
    "docs/fleet.md": 4,          # HAProxy; Docker, Helm and a cluster (three times)
    "docs/kv-offload.md": 1,     # a simulation of a thousand long-context turns
    "docs/lab-stack.md": 3,      # Docker Compose; its tools
    "docs/pd.md": 2,             # vllm-router (the P/D conformance test runs it); a sweep of 3 served runs
    "docs/routers.md": 2,        # vllm-router (the conformance test runs it)
    "docs/testing.md": 2,        # the test suite itself
}
MACHINE_PATHS = re.compile(r"(?<![\w.])/(?:work|tmp|home|root|Users)/")
WORK_LOG = re.compile(r"\bissues? #?\d+|(?<![\w/&])#\d+\b|\bhelpers?\b|\bby the lead\b"
                      r"|\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth"
                      r"|last|previous|this|work) sessions?\b", re.IGNORECASE)


def rel(page) -> str:
    return str(page.relative_to(ROOT))


def runnable(page) -> list:
    return [b for b in blocks(page) if b.lang in RUN | PARSE and not b.no_run]


@pytest.mark.parametrize("page", [p for p in pages() if runnable(p)], ids=rel)
def test_every_example_on_the_page_runs_as_shown(page, tmp_path):
    if shutil.which("curl") is None:
        pytest.skip("the examples use curl: apt-get install curl")
    with Page(page, tmp_path) as run:
        for block in runnable(page):
            run.run(block)


def test_every_block_is_run_parsed_shown_or_marked_and_the_marks_are_counted():
    counts, unknown = {}, []
    for page in pages():
        for block in blocks(page):
            if block.lang not in RUN | PARSE | SHOW:
                unknown.append(f"{block.where}: ```{block.lang}")
            elif block.no_run and block.lang not in RUN:
                unknown.append(f"{block.where}: no-run on a block that is never run")
            counts[rel(page)] = counts.get(rel(page), 0) + block.no_run
    assert unknown == [], "blocks in no known language (run, parse, show or mark them):\n" + "\n".join(unknown)
    assert {p: n for p, n in counts.items() if n} == NO_RUN
    run = sum(1 for page in pages() for b in blocks(page) if b.lang in RUN and not b.no_run)
    assert run >= 40 and run > 3 * sum(NO_RUN.values()), (run, NO_RUN)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text without markup, lower case, punctuation
    dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    fenced = {i for b in blocks(page) for i in range(b.line, b.line + b.text.count("\n") + 2)}
    for number, line in enumerate(page.read_text().splitlines(), 1):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match and number not in fenced:
            base = slug(match[1])
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page) -> list[tuple[int, str]]:
    """(line, target) of every inline or reference link outside code."""
    fenced = {i for b in blocks(page) for i in range(b.line, b.line + b.text.count("\n") + 2)}
    found = []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if number in fenced:
            continue
        line = re.sub(r"`[^`]*`", "", line)
        found += [(number, m) for m in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line)]
        found += [(number, m) for m in re.findall(r"^\s*\[[^\]]+\]:\s+(\S+)", line)]
    return found


def test_every_relative_link_resolves_to_a_file_and_heading():
    broken = []
    for page in pages():
        for number, target in links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{rel(page)}:{number}: {target}"
            if not dest.exists():
                broken.append(where + " (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(where + " (no such heading)")
    assert broken == []


def test_the_pages_speak_of_the_project_only():
    found = []
    for page in pages():
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for pattern in (MACHINE_PATHS, WORK_LOG):
                found += [f"{rel(page)}:{number}: {m[0]!r}" for m in pattern.finditer(line)]
    assert found == []


def test_the_readme_is_a_short_front_door_with_the_test_command():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    assert re.search(r"^pip install '\.\[test\]' && python -P -m pytest -q\b", readme, re.MULTILINE)
    linked = {target.partition("#")[0] for _, target in links(ROOT / "README.md")}
    docs = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert docs - linked == set(), "docs pages the README's topics do not link"


WRONG = """\
```bash
true
false
true
```

```console
$ echo one; echo two
one
three
```

```console
$ echo hello
h...o
```

```bash
curl localhost:8080/missing
```

```pycon
>>> 1 + 1
3
```

```console
$ curl -s -o /dev/null -w '%{http_code}' localhost:8080/missing
404
```
"""


def test_the_runner_fails_a_failing_command_a_wrong_output_and_a_4xx(tmp_path):
    """The runner itself, on a page of blocks that must fail (and two that must pass),
    against a loopback server that answers 404 (nothing else is started)."""
    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(404)

        def log_message(self, *args):
            pass

    page = tmp_path / "page.md"
    page.write_text(WRONG)
    outcomes = []
    (tmp_path / "run").mkdir()
    with Page(page, tmp_path / "run") as run:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", run.ports.http), NotFound)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            for block in blocks(page):
                try:
                    run.run(block)
                    outcomes.append("passed")
                except AssertionError as exc:
                    outcomes.append(str(exc).splitlines()[0])
        finally:
            server.shutdown()
            server.server_close()
    assert outcomes[0] == f"{page}:1: exit status 1"  # `false` in the middle of a script
    assert outcomes[1].startswith(f"{page}:7: `echo one; echo two` exited 0")  # two, not three
    assert outcomes[2] == "passed"  # h...o matches hello
    assert outcomes[3] == f"{page}:18: exit status 22"  # curl --fail-with-body on the 404
    assert outcomes[4].startswith(f"{page}:22:")  # the doctest's 3
    assert outcomes[5] == "passed"  # the console shows the 404 it expects
