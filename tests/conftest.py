"""Fixtures shared across test files."""

import anthropic
import openai
import pytest
from aiohttp.test_utils import TestClient, TestServer

from inference_lab.gateway import aiohttp_gate, create_app
from inference_lab.testing.fake_engine import FakeEngine
from system_tools import check_marks


def pytest_runtest_setup(item):
    check_marks(item)  # @pytest.mark.tools(...): skip, or fail under INFERENCE_LAB_REQUIRE_TOOLS=1
    if item.get_closest_marker("fast_paths") is not None and not aiohttp_gate.fast_paths():
        pytest.skip("aiohttp's fast paths are off (gateway.aiohttp_gate)")


@pytest.fixture
async def fake():
    """A narrow fake engine on a free loopback port (gateway unit tests only)."""
    engine = FakeEngine()
    await engine.start()
    yield engine
    await engine.stop()


@pytest.fixture
async def client(fake):
    """An aiohttp test client of the real gateway app in front of the fake engine (a test
    file that needs other create_app arguments defines its own `client`)."""
    async with TestClient(TestServer(create_app(fake.target))) as c:
        yield c


@pytest.fixture
def oai(served):
    """The official `openai` client of the test module's `served` server (no retries)."""
    return openai.OpenAI(base_url=served.base + "/v1", api_key="unused", max_retries=0, timeout=30)


@pytest.fixture
def claude(served):
    """The official `anthropic` client of the test module's `served` server (no retries)."""
    return anthropic.Anthropic(base_url=served.base, api_key="unused", max_retries=0, timeout=30)
