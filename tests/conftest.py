"""Fixtures shared across test files."""

import pytest
from aiohttp.test_utils import TestClient, TestServer

from inference_lab.gateway import create_app
from inference_lab.testing.fake_engine import FakeEngine


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
