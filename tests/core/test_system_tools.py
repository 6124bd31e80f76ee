"""The tests' system tools (tests/system_tools.py): a missing tool skips its test with the
apt-get install that brings it, or fails it under INFERENCE_LAB_REQUIRE_TOOLS=1 (CI)."""

from __future__ import annotations

import shutil

import pytest

import system_tools
from system_tools import tool


@pytest.fixture
def nothing_installed(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv(system_tools.REQUIRE, raising=False)


def test_a_missing_tool_skips_naming_the_package_that_installs_it(nothing_installed):
    with pytest.raises(pytest.skip.Exception, match=r"^promtool not installed "
                                                    r"\(apt-get install prometheus\)$"):
        tool("promtool")
    assert tool("curl", optional=True) is None  # (a test with a fallback of its own)


@pytest.mark.parametrize("setting", ["1", "yes"])
def test_with_tools_required_a_missing_tool_fails_even_an_optional_one(nothing_installed,
                                                                       monkeypatch, setting):
    monkeypatch.setenv(system_tools.REQUIRE, setting)
    for optional in (False, True):
        with pytest.raises(pytest.fail.Exception, match=r"^haproxy not installed \(apt-get "
                                                        r"install haproxy\); INFERENCE_LAB"):
            tool("haproxy", optional=optional)


def test_a_present_tool_is_its_path_and_an_unknown_one_is_an_error(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: f"/opt/bin/{name}")
    monkeypatch.setenv(system_tools.REQUIRE, "1")
    assert tool("docker-compose") == "/opt/bin/docker-compose"
    with pytest.raises(KeyError):
        tool("grpcurl")  # (pip installs that one: not a system tool)


@pytest.mark.parametrize("setting, required", [("", False), ("0", False), ("1", True)])
def test_only_a_set_requirement_makes_tools_mandatory(monkeypatch, setting, required):
    monkeypatch.setenv(system_tools.REQUIRE, setting)
    assert system_tools.required() is required
