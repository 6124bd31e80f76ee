"""Reading and linting Prometheus expositions in tests: promtool's verdict, samples by name."""

from __future__ import annotations

import re
import subprocess

from system_tools import tool

# promtool's linter findings that vLLM's own names produce, kept on purpose so that anything
# that scrapes vLLM reads the lab unchanged: ':' in names (a convention reserved for
# recording rules) and the histogram vllm:iteration_tokens_total (a `_total` suffix).
VLLM_NAME_LINTS = (
    re.compile(r"^vllm:\w+ metric names should not contain ':'$"),
    re.compile(r'^vllm:iteration_tokens_total non-counter metrics should not have "_total" suffix$'),
)


def promtool_check(body: str) -> tuple[int, list[str]]:
    """(exit status, findings other than vLLM's own names) of `promtool check metrics`
    (skips the test without promtool: system_tools)."""
    run = subprocess.run([tool("promtool"), "check", "metrics"], input=body, capture_output=True,
                         text=True, timeout=60)
    findings = [line.strip() for line in (run.stdout + run.stderr).splitlines() if line.strip()]
    problems = [f for f in findings if not any(p.match(f) for p in VLLM_NAME_LINTS)]
    # 0 = clean; 3 = lint findings only; anything else = a parse error
    assert run.returncode == (3 if findings else 0), run.stdout + run.stderr
    return run.returncode, problems


def sample(body: str, name: str, **labels: str) -> float:
    """The value of the one sample `name` whose labels include `labels` (0 when absent)."""
    for line in body.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        found = dict(re.findall(r'(\w+)="([^"]*)"', head))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(value)
    return 0.0
