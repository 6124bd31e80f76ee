"""A served lab, as the experiment runner reaches it: the wall clock, a timerfd for the open
loop's sends, the load's endpoints, and a small HTTP client for the control plane.

Knows HTTP/1.1 just enough for small control requests (capacity, replicas, faults, scrapes)
on a fresh connection each. Does not know the scenario or the load (experiments.runner;
experiments.virtual is the same interface in virtual time).
"""

from __future__ import annotations

import asyncio
import json
import re
from urllib.parse import urlsplit

from inference_lab.engine.drivers.alarm import Timer
from inference_lab.experiments.client import Endpoint, monotonic

__all__ = ["Http", "LiveBackend"]


class Http:
    """Small control-plane requests (capacity, scrapes): a fresh connection each, so they
    never queue behind the load's keep-alive streams."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token

    async def request(self, method: str, url: str, body: dict | None = None,
                      timeout: float = 5.0) -> tuple[int, bytes]:
        parts = urlsplit(url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        raw = json.dumps(body).encode() if body is not None else b""
        head = [f"{method} {path or '/'} HTTP/1.1", f"Host: {parts.hostname}:{parts.port}",
                "Connection: close", f"Content-Length: {len(raw)}"]
        if body is not None:
            head.append("Content-Type: application/json")
        if self.token:
            head.append(f"Authorization: Bearer {self.token}")

        async def go() -> tuple[int, bytes]:
            reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
            try:
                writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + raw)
                head_bytes = await reader.readuntil(b"\r\n\r\n")
                status = int(head_bytes[9:12]) if head_bytes.startswith(b"HTTP/1.") else -1
                match = re.search(rb"(?i)content-length:\s*(\d+)", head_bytes)
                body = (await reader.readexactly(int(match.group(1))) if match
                        else await reader.read(-1))
            finally:
                writer.close()
            return status, body

        async with asyncio.timeout(timeout):
            return await go()


class LiveBackend:
    """A served lab: the wall clock, a timerfd, HTTP."""

    virtual = False

    def __init__(self, base_url: str, model: str, api_key: str | None = None,
                 control_token: str | None = None, pooling: bool = False) -> None:
        self.base_url = base_url.rstrip("/")
        self.model, self.api_key, self.pooling = model, api_key, pooling
        self.http = Http(control_token)
        self.clock = monotonic

    def timer(self, loop: asyncio.AbstractEventLoop, callback) -> Timer:
        return Timer(loop, callback)

    def endpoint(self, url: str) -> Endpoint:
        return Endpoint(url, self.model, self.api_key, pooling=self.pooling)
