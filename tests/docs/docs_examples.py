"""The fenced code blocks of the README and docs/*.md, and how each one is run.

A block's language (the fence's first word) says what is done with it:

- `bash`, `sh`: run as one script (`set -eo pipefail`), so every command must succeed;
  `curl` fails on an HTTP status of 400 or more (`--fail-with-body`);
- `console`: `$ ` commands (`> ` continues one), each run alone and its output (stdout
  and stderr, as a terminal shows them) compared with the lines shown under it: `...`
  matches any text in a line, a line of just `...` any lines; a command exits 0 unless the
  output shows curl's own error line, `curl: (N) ...`, which says its exit status;
- `python`: executed in one namespace per page, in order (later blocks use earlier names);
- `pycon`: `>>> ` sessions run as doctests in that namespace, outputs compared (`...`
  matches anything);
- `toml`, `json`: parsed;
- `text`, `http`: shown, not run (diagrams, wire bytes).

`no-run` after the language (```` ```bash no-run ````) marks a block that cannot run in a
test (Docker, Helm, a long experiment, the test suite itself); the docs test pins how many
each page has. Any other language fails the test, so nothing is left unrun by accident.

Examples address the server as a reader's would be: `localhost:8080` (replica i on 8080 +
i), the engine on 50051 (metrics 50052), KV events on 5557 / 5558. The page's run writes
its own free loopback ports in their place, and `inference-lab serve | engine | gateway`
starts the server in the background (`docs_launch`).
"""

from __future__ import annotations

import doctest
import json
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from inference_lab.common.ports import free_port, free_port_run

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = Path(__file__).with_name("docs_launch.py")
sys.path.insert(0, str(LAUNCHER.parent))
import docs_launch  # noqa: E402  (beside this file)

SHELL = {"bash", "sh"}
RUN = SHELL | {"console", "python", "pycon"}
PARSE = {"toml", "json"}
SHOW = {"text", "http"}
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
REPLICAS = 10  # ports 8080 .. 8089 of the examples


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, from 1
    lang: str
    attrs: tuple[str, ...]
    text: str

    @property
    def no_run(self) -> bool:
        return "no-run" in self.attrs

    @property
    def where(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(page: Path) -> list[Block]:
    """Every fenced block of the page, in order (an indented fence, in a list, dedented)."""
    found, lines, i = [], page.read_text().splitlines(), 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence = len(match["indent"]), match["fence"]
        info = match["info"].split()
        body, j = [], i + 1
        while j < len(lines) and not re.match(rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[j]):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        if j == len(lines):
            raise AssertionError(f"{page}:{i + 1}: the fence is never closed")
        found.append(Block(page, i + 1, info[0] if info else "", tuple(info[1:]), "\n".join(body) + "\n"))
        i = j + 1
    return found


class Ports:
    """The page's free loopback ports, in place of the examples' well-known ones."""

    def __init__(self) -> None:
        self.http = free_port_run(REPLICAS)
        self.engine, self.metrics = free_port(), free_port()
        # 5557 / 5558 of the examples: replica k's on kv + 2k and kv + 1 + 2k (the stride
        # of ports one apart), every one inside this run
        self.kv = free_port_run(2 * REPLICAS)
        self.kv_replay = self.kv + 1

    def localize(self, text: str) -> str:
        text = re.sub(r"\blocalhost:(?=\d)", "127.0.0.1:", text)
        text = re.sub(r"(?<=:)808(\d)\b", lambda m: str(self.http + int(m[1])), text)
        for known, port in (("50051", self.engine), ("50052", self.metrics),
                            ("5557", self.kv), ("5558", self.kv_replay)):
            text = re.sub(rf"\b{known}\b", str(port), text)
        return text

    def env(self) -> dict[str, str]:
        return {"DOCS_PORTS": json.dumps({"http": self.http, "engine": self.engine,
                                          "metrics": self.metrics})}


PRELUDE = """\
python() { "$DOCS_PYTHON" "$@"; }  # the interpreter the lab is installed in
inference-lab() {
  case "${1-}" in
    serve|engine|gateway) "$DOCS_PYTHON" -P "$DOCS_LAUNCHER" "$@" ;;
    *) command inference-lab "$@" ;;
  esac
}
"""
SCRIPT_PRELUDE = PRELUDE + """\
curl() { command curl -sS --fail-with-body --max-time 60 "$@"; }
set -eo pipefail
"""
CONSOLE_PRELUDE = PRELUDE + """\
curl() {  # quiet as in a terminal: no progress meter, errors shown unless -s was asked for
  local arg
  for arg in "$@"; do
    case "$arg" in
      --silent) command curl --max-time 60 "$@"; return ;;
      --*) ;;
      -*s*) command curl --max-time 60 "$@"; return ;;
    esac
  done
  command curl -sS --max-time 60 "$@"
}
"""
BACKGROUND_START = re.compile(r"^(\s*(?:\w+=\S*\s+)*inference-lab\s+(?:serve|engine|gateway)\b.*?)\s*&\s*$")
CURL_ERROR = re.compile(r"^curl: \((\d+)\)")


def foreground_starts(script: str) -> str:
    """`inference-lab serve ... &` without the `&`: the launcher goes to the background
    itself, once the server is ready (so the next line does not race it)."""
    return "\n".join(BACKGROUND_START.sub(r"\1", line) for line in script.splitlines()) + "\n"


def console_commands(text: str) -> list[tuple[str, list[str]]]:
    """(command, expected output lines) for each `$ ` of a console block."""
    commands: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], []))
        elif line.startswith("> ") and commands and not commands[-1][1]:
            commands[-1] = (commands[-1][0] + "\n" + line[2:], [])
        elif commands:
            commands[-1][1].append(line)
        elif line.strip():
            raise AssertionError(f"console output before any `$ ` command: {line!r}")
    return commands


def output_matches(expected: list[str], actual: str) -> bool:
    """Line by line, trailing blanks ignored and runs of spaces equal; `...` matches any
    text within a line, and a line of just `...` any number of lines (none too)."""
    pattern = ""
    for line in "\n".join(line.rstrip() for line in expected).strip("\n").split("\n"):
        if line == "...":
            pattern += r"(?:[^\n]*\n)*?"
        else:
            parts = (re.sub(r" +", " +", re.escape(part)) for part in line.split("..."))
            pattern += "[^\n]*?".join(parts) + "\n"
    got = "\n".join(line.rstrip() for line in actual.splitlines()).strip("\n") + "\n"
    return re.fullmatch(pattern, got) is not None


class Page:
    """One page's examples run in order against the servers they start, in `workdir`
    (which sees the repository's configs/ and deploy/, so paths read as in a checkout)."""

    def __init__(self, page: Path, workdir: Path) -> None:
        self.page, self.workdir = page, workdir
        self.ports = Ports()
        self.namespace: dict = {"__name__": "__docs__"}
        for name in ("configs", "deploy", "calibration", "benchmarks"):
            (workdir / name).symlink_to(ROOT / name)
        env = {k: v for k, v in os.environ.items() if not k.startswith("INFERENCE_LAB_")}
        self.env = {**env, **self.ports.env(), "DOCS_RUN_DIR": str(workdir),
                    "DOCS_PYTHON": sys.executable, "DOCS_LAUNCHER": str(LAUNCHER),
                    "PATH": os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")}

    def __enter__(self) -> Page:
        return self

    def __exit__(self, *exc) -> None:
        docs_launch.stop_all(self.workdir)

    def server_logs(self) -> str:
        return "\n".join(p.read_text()[-2000:] for p in sorted(self.workdir.glob("*.log")))

    def run(self, block: Block) -> None:
        text = self.ports.localize(block.text)
        if block.lang in SHELL:
            self._shell(block, SCRIPT_PRELUDE + foreground_starts(text), None)
        elif block.lang == "console":
            for command, expected in console_commands(text):
                self._shell(block, CONSOLE_PRELUDE + foreground_starts(command), expected, command)
        elif block.lang == "python":
            exec(compile(text, block.where, "exec"), self.namespace)  # noqa: S102
        elif block.lang == "pycon":
            self._doctest(block, text)
        elif block.lang == "toml":
            tomllib.loads(text)
        elif block.lang == "json":
            json.loads(text)

    def _shell(self, block: Block, script: str, expected: list[str] | None = None,
               command: str = "") -> None:
        done = subprocess.run(["bash", "--noprofile", "--norc", "-c", script], cwd=self.workdir,
                              env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=180)  # one stream, as a terminal shows it
        output = done.stdout
        if expected is None:
            assert done.returncode == 0, (f"{block.where}: exit status {done.returncode}\n"
                                          f"{output[-3000:]}\n{self.server_logs()}")
            return
        status = next((int(m[1]) for m in map(CURL_ERROR.match, expected) if m), 0)
        assert done.returncode == status and output_matches(expected, output), (
            f"{block.where}: `{command}` exited {done.returncode} "
            f"(expected {status}) with\n{output[-3000:]}\nexpected\n" + "\n".join(expected))

    def _doctest(self, block: Block, text: str) -> None:
        test = doctest.DocTestParser().get_doctest(text, self.namespace, block.where,
                                                   str(block.page), block.line)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        report: list[str] = []
        runner.run(test, out=report.append, clear_globs=False)
        assert runner.failures == 0, f"{block.where}:\n" + "".join(report)
