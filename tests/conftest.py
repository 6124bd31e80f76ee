"""Fixtures shared across test files."""

import pytest

from inference_lab.testing.fake_engine import FakeEngine


@pytest.fixture
async def fake():
    """A narrow fake engine on a free loopback port (gateway unit tests only)."""
    engine = FakeEngine()
    await engine.start()
    yield engine
    await engine.stop()
