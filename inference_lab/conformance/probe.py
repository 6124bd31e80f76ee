"""The HTTP side of the conformance check: one blocking client over urllib that returns
every answer (4xx and 5xx included) as a `Reply`, and raises `Unreachable` only when no
answer came at all (refused connection, unknown host, timeout before the status line).

It knows nothing of which routes matter; the checks do."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass


class Unreachable(Exception):
    """No HTTP answer from the server (the message says why, in one line)."""


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    content_type: str
    body: bytes

    def json(self):
        """The body as JSON, or None when it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None


class Probe:
    """Requests to one server: `base` is its URL without a trailing slash."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 10.0) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http:// or https:// URL, got {url!r}")
        self.base = url.rstrip("/")
        self.host = parts.hostname
        self.timeout = timeout
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def _request(self, method: str, path: str, body: dict | None, headers: dict | None):
        data = None if body is None else json.dumps(body).encode()
        hdrs = dict(self._headers, **(headers or {}))
        if data is not None:
            hdrs["Content-Type"] = "application/json"
        return urllib.request.Request(self.base + path, data=data, method=method, headers=hdrs)

    def _open(self, req):
        try:
            return urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as err:  # an answer: 4xx or 5xx
            return err
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise Unreachable(f"{req.full_url}: {reason}") from None

    def call(self, method: str, path: str, body: dict | None = None,
             headers: dict | None = None) -> Reply:
        resp = self._open(self._request(method, path, body, headers))
        with resp:
            try:
                payload = resp.read()
            except (OSError, socket.timeout) as err:
                raise Unreachable(f"{self.base + path}: {err}") from None
            return Reply(resp.status, resp.headers.get("Content-Type", ""), payload)

    def get(self, path: str) -> Reply:
        return self.call("GET", path)

    def post(self, path: str, body: dict, headers: dict | None = None) -> Reply:
        return self.call("POST", path, body, headers)

    def stream(self, path: str, body: dict) -> tuple[int, str, Iterator[str]]:
        """POST and read the answer line by line as it arrives: (status, content type,
        the lines without their line ends)."""
        resp = self._open(self._request("POST", path, body, None))

        def lines() -> Iterator[str]:
            with resp:
                for raw in resp:
                    yield raw.decode("utf-8", "replace").rstrip("\r\n")

        return resp.status, resp.headers.get("Content-Type", ""), lines()
