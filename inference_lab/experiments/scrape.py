"""The runner's scrape of the server's queue gauges (experiments.runner.Runner mixes it in):
waiting, running and the capacity knobs every `scrape_interval`, from the engine's
/metrics, else from GET /control/capacity; a fleet's: the sums over its replicas. Each
scrape also moves the records kept so far out of the collector's full passes. An SGLang
profile's /metrics names the queue gauges its way (common.engine_series) and has no
capacity gauges: those come from GET /control/capacity beside it.

Knows /metrics, /control/capacity and /control/replicas' rows. Does not know the load.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging

from inference_lab.common.engine_series import SGLANG, engine_of, renamed
from inference_lab.common.prometheus_text import model_sums

__all__ = ["GAUGES", "SCRAPE_INTERVAL", "ScrapeSide", "parse_gauges"]

log = logging.getLogger("inference_lab.experiments.runner")

SCRAPE_INTERVAL = 0.25  # wall seconds between scrapes of the queue gauges (default)

GAUGES = {
    "vllm:num_requests_waiting": "waiting",
    "vllm:num_requests_running": "running",
    "inference_lab_max_num_seqs": "max_num_seqs",
    "inference_lab_max_waiting": "max_waiting",
}


def parse_gauges(text: str, model: str) -> dict[str, float]:
    """The queue gauges of `model` from a Prometheus text exposition, summed over its
    engines (a server of several data-parallel ranks: one sample per `engine`), by the
    names of the engine the exposition is from."""
    gauges = renamed(GAUGES, engine_of(text))
    return {gauges[name]: value for name, value in model_sums(text, gauges, model).items()}


class ScrapeSide:
    """The scrape's half of the Runner (its attributes are set in Runner.__init__)."""

    async def scrape(self) -> dict[str, float]:
        """The queue gauges from the engine's /metrics, else (none given, or it stopped
        answering: an engine restarted after a crash has a new metrics port) from the
        server's GET /control/capacity; a fleet's: the sums over its replicas."""
        if self.fleet is not None:
            rows = await self.read_replicas()
            return {"waiting": float(sum(r["waiting"] for r in rows)),
                    "running": float(sum(r["running"] for r in rows if not r["starting"]))}
        if self.metrics_url:
            try:
                status, body = await self.http.request("GET", self.metrics_url)
            except (OSError, asyncio.TimeoutError):
                status, body = -1, b""
            if status == 200:
                text = body.decode("utf-8", "replace")
                gauges = parse_gauges(text, self.sc.model)
                if engine_of(text) != SGLANG:
                    return gauges
                knobs = await self._capacity()  # (SGLang's exposition has no knobs)
                return {**{k: v for k, v in knobs.items() if k.startswith("max_")}, **gauges}
        return await self._capacity()

    async def _capacity(self) -> dict[str, float]:
        """The queue gauges of GET /control/capacity's rows of the model (a server of
        data-parallel ranks: a row each, summed)."""
        status, body = await self.http.request("GET", self.base + "/control/capacity")
        if status != 200:
            return {}
        out: dict[str, float] = {}
        for row in json.loads(body):
            if row.get("model") == self.sc.model:
                for k in GAUGES.values():
                    if k in row:
                        out[k] = out.get(k, 0.0) + float(row[k])
        return out

    async def _scraper(self) -> None:
        interval = self.sc.scrape_interval if self.sc.scrape_interval is not None else SCRAPE_INTERVAL * self.k
        tick = 0
        while True:
            gc.freeze()  # the last interval's survivors (records) out of the full passes
            started = self.now()
            try:
                gauges = await self.scrape()
            except (OSError, asyncio.TimeoutError, ValueError) as exc:
                log.debug("scrape failed: %s", exc)
                gauges = {}
            if gauges:
                self.records.server(started, gauges)
            tick += 1
            await self._sleep_until(tick * interval)
