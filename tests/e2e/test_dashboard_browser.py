"""The dashboard in headless Chromium against the real `serve` (a control token set): the
page loads with no console error, its numbers and charts move under streaming load, and a
knob changed on the page (the token typed in, max_num_seqs set to 1) is the server's: GET
/control/capacity says so and a second stream waits behind the first. Without the token
the knob is refused and the page says so.

DASHBOARD_SCREENSHOTS=docs/images writes the page at 1280x800 and 390x844 under load
there (the images docs/dashboard.md shows)."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import threading
import urllib.request
from pathlib import Path

import pytest

from inference_lab.testing.launch import serve
from inference_lab.testing.poll import wait_until
from system_tools import tool

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
TOKEN = "ct-lab-dashboard"
MODEL = "gpt-oss-20b"
KEY = f"{MODEL}/0"

pytestmark = pytest.mark.tools("chromium")


@pytest.fixture(scope="module")
def served():
    with serve("--max-waiting", "16", env={"INFERENCE_LAB_CONTROL_TOKEN": TOKEN}) as s:
        yield s


class Streams:
    """Streaming chat requests, each read line by line on a thread of its own until it
    ends or `close()` hangs up."""

    def __init__(self, base: str) -> None:
        self.host, self.port = base.removeprefix("http://").split(":")
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.statuses: list[int] = []

    def start(self, n: int, max_tokens: int) -> None:
        for _ in range(n):
            thread = threading.Thread(target=self._one, args=(max_tokens,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _one(self, max_tokens: int) -> None:
        conn = http.client.HTTPConnection(self.host, int(self.port), timeout=60)
        try:
            conn.request("POST", "/v1/chat/completions", body=json.dumps({
                "model": MODEL, "stream": True, "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": "Tell me a long story."}]}),
                headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            self.statuses.append(resp.status)
            while not self.stop.is_set() and resp.readline():
                pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)


def capacity(served) -> dict:
    request = urllib.request.Request(served.base + f"/control/capacity?model={MODEL}",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read())[0]


def set_capacity(served, **fields) -> None:
    request = urllib.request.Request(
        served.base + "/control/capacity", method="POST",
        data=json.dumps({"model": MODEL, **fields}).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=10).close()


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=tool("chromium"), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def open_page(browser, served, errors: list[str], width: int = 1280, height: int = 800):
    page = browser.new_page(viewport={"width": width, "height": height})
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(served.base + "/")  # redirected to /dashboard
    assert page.url.endswith("/dashboard")
    wait_until(lambda: int(page.get_attribute("#status", "data-polls")) >= 2,
               what="two polls of the feed")
    return page


def number(page, selector: str) -> float:
    return float(page.inner_text(f"[data-key='{KEY}'] {selector}"))


def test_the_page_loads_and_moves_under_streaming_load(served, browser, tmp_path):
    errors: list[str] = []
    page = open_page(browser, served, errors)
    assert page.inner_text("#status") == "live"
    assert page.inner_text(f"[data-model='{MODEL}'] h2") == MODEL
    assert number(page, ".max_num_seqs") == 256 and number(page, ".max_waiting") == 16
    idle_points = int(page.get_attribute(f"[data-key='{KEY}'] .queue", "data-points"))
    streams = Streams(served.base)
    streams.start(6, max_tokens=6000)
    try:
        # the page shows the streams running and tokens flowing, and its charts grow
        wait_until(lambda: number(page, ".running") >= 6, what="six streams running on the page")
        wait_until(lambda: page.inner_text(f"[data-key='{KEY}'] .tokens") not in ("–", "0")
                   and number(page, ".tokens") > 100, what="tokens per second on the page")
        wait_until(lambda: float(page.inner_text(f"[data-key='{KEY}'] .kv").split()[0]) > 0,
                   what="KV-cache usage on the page")
        points = int(page.get_attribute(f"[data-key='{KEY}'] .queue", "data-points"))
        assert points > idle_points
        last = json.loads(page.get_attribute(f"[data-key='{KEY}'] .queue", "data-last"))
        assert last[1] >= 6  # the chart's running series (waiting, running, ...)
        wait_until(lambda: int(page.get_attribute(f"[data-key='{KEY}'] .queue", "data-points")) >= 8,
                   what="a few seconds drawn")
        shots = [(1280, 800, "dashboard-1280.png"), (390, 844, "dashboard-390.png")]
        for width, height, name in shots:
            page.set_viewport_size({"width": width, "height": height})
            wait_until(lambda: page.evaluate("document.documentElement.clientWidth") == width,
                       what=f"the page at {width} px")
            page.screenshot(path=str(tmp_path / name), full_page=(width < 600))
    finally:
        streams.close()
    assert set(streams.statuses) == {200}
    assert errors == []
    for _, _, name in shots:
        assert (tmp_path / name).stat().st_size > 20_000  # a page of charts, not a blank one
    out = os.environ.get("DASHBOARD_SCREENSHOTS")
    if out:
        for _, _, name in shots:
            shutil.copy(tmp_path / name, Path(out) / name)


def test_a_knob_on_the_page_is_the_servers_and_the_queue_follows_it(served, browser):
    errors: list[str] = []
    page = open_page(browser, served, errors)
    form = f"[data-model='{MODEL}'] form.capacity"
    try:
        # without the token: refused, and the page says why; nothing changed
        page.fill(f"{form} input[name=max_num_seqs]", "1")
        page.click(f"{form} button")
        wait_until(lambda: page.get_attribute("#message", "class") == "error",
                   what="the refusal on the page")
        assert "401" in page.inner_text("#message")
        assert capacity(served)["max_num_seqs"] == 256
        # with it
        page.fill("#token", TOKEN)
        page.click(f"{form} button")
        wait_until(lambda: page.inner_text("#message").endswith("done"), what="the knob applied")
        assert capacity(served)["max_num_seqs"] == 1
        wait_until(lambda: number(page, ".max_num_seqs") == 1, what="max_num_seqs 1 on the page")
        # one place: a second stream waits behind the first, on the server and on the page
        streams = Streams(served.base)
        streams.start(2, max_tokens=20000)
        try:
            wait_until(lambda: (lambda c: c["running"] == 1 and c["waiting"] == 1)(capacity(served)),
                       timeout=20, what="one stream running, one waiting")
            wait_until(lambda: (number(page, ".waiting"), number(page, ".running")) == (1, 1),
                       what="one running, one waiting on the page")
        finally:
            streams.close()
    finally:
        set_capacity(served, max_num_seqs=256)
    assert errors == [] or all("401" in e for e in errors)  # the refused knob's response
