"""The system tools some tests need (not pip-installable): where each is, and what a test
does when one is absent: it skips, naming the `apt-get install` that brings the tool; with
INFERENCE_LAB_REQUIRE_TOOLS=1 (CI, .ci/run) it fails instead, so no such test is ever
skipped there unnoticed.

A test says what it needs with the mark `@pytest.mark.tools("haproxy", ...)` (checked by
tests/conftest.py before the test runs), or asks `tool("promtool")` where it needs the
path; `tool(name, optional=True)` is for a test with a fallback of its own (None when
absent, except under INFERENCE_LAB_REQUIRE_TOOLS=1, which fails)."""

from __future__ import annotations

import os
import shutil

import pytest

REQUIRE = "INFERENCE_LAB_REQUIRE_TOOLS"
# tool -> the Debian package that installs it
PACKAGES = {
    "chromium": "chromium",
    "curl": "curl",
    "docker-compose": "docker-compose",
    "haproxy": "haproxy",
    "prometheus": "prometheus",
    "promtool": "prometheus",
    "ss": "iproute2",
}


def required() -> bool:
    """Whether an absent tool fails the test (INFERENCE_LAB_REQUIRE_TOOLS=1)."""
    return os.environ.get(REQUIRE, "").strip() not in ("", "0")


def missing_message(name: str) -> str:
    return f"{name} not installed (apt-get install {PACKAGES[name]})"


def tool(name: str, optional: bool = False) -> str | None:
    """The path of system tool `name`. Absent: the test is skipped (with `optional`, None
    is returned), or fails under INFERENCE_LAB_REQUIRE_TOOLS=1."""
    if name not in PACKAGES:
        raise KeyError(f"unknown system tool {name!r}: add it to PACKAGES")
    path = shutil.which(name)
    if path is None:
        message = missing_message(name)
        if required():
            pytest.fail(f"{message}; {REQUIRE}=1 makes it mandatory", pytrace=False)
        if not optional:
            pytest.skip(message)
    return path


def check_marks(item: pytest.Item) -> None:
    """Every tool named by the item's `tools` marks is here (else skip, or fail)."""
    for mark in item.iter_markers("tools"):
        for name in mark.args:
            tool(name)
