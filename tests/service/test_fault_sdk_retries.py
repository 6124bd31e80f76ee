"""The official `openai` and `anthropic` SDKs against scripted 529/429 sequences with and
without retry hints: how many attempts they make and how long they wait between them.

Each attempt's start is recorded by an httpx event hook of the SDK's own client, so the
waits measured are the SDKs' (plus a few milliseconds of request time).
"""

from __future__ import annotations

import asyncio
import time

import anthropic
import httpx2 as httpx  # the HTTP client these SDK versions are built on
import openai
import pytest
from aiohttp.test_utils import TestServer

from inference_lab.gateway import create_app
from inference_lab.testing.fake_engine import FAKE_MODEL

MESSAGES = [{"role": "user", "content": "hi"}]
SLACK = 0.15  # request time and scheduling on a loaded two-core machine


@pytest.fixture
async def base(fake):
    server = TestServer(create_app(fake.target))
    await server.start_server()
    yield f"http://127.0.0.1:{server.port}"
    await server.close()


async def faults(base: str, **body) -> None:
    async with httpx.AsyncClient() as c:
        resp = await c.post(f"{base}/control/faults", json=body)
        assert resp.status_code == 200, resp.text


class Attempts:
    def __init__(self) -> None:
        self.times: list[float] = []

    def hook(self, request: httpx.Request) -> None:
        if request.url.path.startswith("/v1/"):
            self.times.append(time.monotonic())

    @property
    def waits(self) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:])]


def openai_client(base: str, attempts: Attempts, max_retries: int = 2) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=max_retries,
                         http_client=httpx.Client(event_hooks={"request": [attempts.hook]}))


def anthropic_client(base: str, attempts: Attempts, max_retries: int = 2) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key="x", max_retries=max_retries,
                               http_client=httpx.Client(event_hooks={"request": [attempts.hook]}))


def chat(client: openai.OpenAI):
    return client.chat.completions.create(model=FAKE_MODEL, messages=MESSAGES, max_tokens=2)


async def test_openai_honours_retry_after_ms_through_two_529s_then_succeeds(base):
    await faults(base, retry_after_ms=200, script=[{"error": "queue_saturated", "count": 2}])
    attempts = Attempts()
    reply = await asyncio.to_thread(chat, openai_client(base, attempts))
    assert reply.usage.completion_tokens == 2
    assert len(attempts.times) == 3
    assert all(0.19 <= w <= 0.2 + SLACK for w in attempts.waits), attempts.waits


async def test_openai_without_hints_backs_off_exponentially_then_gives_up(base):
    await faults(base, script=[{"error": "rate_limit", "count": 3}])
    attempts = Attempts()
    with pytest.raises(openai.RateLimitError):
        await asyncio.to_thread(chat, openai_client(base, attempts))
    assert len(attempts.times) == 3  # max_retries = 2
    first, second = attempts.waits  # 0.5 s * 2^n, less up to 25 % jitter
    assert 0.375 <= first <= 0.5 + SLACK and 0.75 <= second <= 1.0 + SLACK, attempts.waits


@pytest.mark.parametrize("hint, error, status", [
    ({"should_retry": False}, "overloaded", 503),  # x-should-retry: false is obeyed
    ({"retry_after": 121}, "queue_saturated", 529),  # retry-after over two minutes: no retry
], ids=["x-should-retry-false", "retry-after-over-two-minutes"])
async def test_openai_does_not_retry_when_the_hints_say_not_to(base, hint, error, status):
    await faults(base, **hint, script=[{"error": error, "count": 1}])
    attempts = Attempts()
    with pytest.raises(openai.APIStatusError) as exc:
        await asyncio.to_thread(chat, openai_client(base, attempts))
    assert exc.value.status_code == status and len(attempts.times) == 1


async def test_openai_honours_fractional_retry_after_seconds(base):
    await faults(base, retry_after=0.3, script=[{"error": "rate_limit", "count": 1}])
    attempts = Attempts()
    await asyncio.to_thread(chat, openai_client(base, attempts))
    (wait,) = attempts.waits
    assert 0.29 <= wait <= 0.3 + SLACK


def anthropic_chat(client: anthropic.Anthropic) -> httpx.Response:
    """The SDK's own request path and retry loop, on the OpenAI route the lab serves."""
    return client.post("/v1/chat/completions", cast_to=httpx.Response,
                       body={"model": FAKE_MODEL, "messages": MESSAGES, "max_tokens": 2})


async def test_anthropic_honours_retry_after_ms_through_529s_then_succeeds(base):
    await faults(base, retry_after_ms=200, script=[{"error": "queue_saturated", "count": 2}])
    attempts = Attempts()
    resp = await asyncio.to_thread(anthropic_chat, anthropic_client(base, attempts))
    assert resp.status_code == 200 and len(attempts.times) == 3
    assert all(0.19 <= w <= 0.2 + SLACK for w in attempts.waits), attempts.waits


async def test_anthropic_messages_gives_up_after_max_retries_on_529(base):
    await faults(base, retry_after_ms=100, script=[{"error": "queue_saturated", "count": 3}])
    attempts = Attempts()
    client = anthropic_client(base, attempts)
    with pytest.raises(anthropic.APIStatusError) as exc:
        await asyncio.to_thread(client.messages.create, model=FAKE_MODEL, max_tokens=2,
                                messages=MESSAGES)
    assert exc.value.status_code == 529 and len(attempts.times) == 3
    assert exc.value.body["error"]["type"] == "overloaded_error"  # Anthropic's envelope


async def test_anthropic_obeys_x_should_retry_false_and_backs_off_without_hints(base):
    await faults(base, should_retry=False, script=[{"error": "rate_limit", "count": 1}])
    attempts = Attempts()
    with pytest.raises(anthropic.RateLimitError):
        await asyncio.to_thread(anthropic_chat, anthropic_client(base, attempts))
    assert len(attempts.times) == 1
    await faults(base, should_retry=None, script=[{"error": "rate_limit", "count": 1}])
    attempts = Attempts()
    await asyncio.to_thread(anthropic_chat, anthropic_client(base, attempts))
    (wait,) = attempts.waits
    assert 0.375 <= wait <= 0.5 + SLACK
