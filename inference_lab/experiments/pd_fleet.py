"""The runner's P/D fleet (experiments.runner.Runner mixes it in): a scenario's
`[fleet] kv_roles`. Its replicas ready, each with the scenario's capacity, split into the
prefill and decode pools by the role each names in GET /control/replicas (which must be
the scenario's P:D); each request then goes through experiments.pd's router, and the
decode replicas' transfer counters are read when the run ends.

Knows GET /control/replicas' kv_role and a replica's /metrics. Does not know the load.
"""

from __future__ import annotations

import asyncio
import json

from inference_lab.experiments.fleet import Route
from inference_lab.experiments.pd import PdRouter, decode_metrics, ratio_name

__all__ = ["PdFleetSide"]

READY_WAIT_PD = 60.0  # wall seconds a P/D fleet's replicas may take to be ready


class PdFleetSide:
    """The P/D half of the Runner (its attributes are set in Runner.__init__)."""

    async def _start_pd(self) -> None:
        """A P/D fleet: its replicas ready, each with the scenario's capacity, split into
        the prefill and decode pools by the role each names (GET /control/replicas), which
        must be the scenario's P:D."""
        deadline = self.clock() + READY_WAIT_PD
        while True:  # (a replica still starting may have no port yet)
            status, body = await self.http.request("GET", self.base + "/control/replicas")
            rows = [r for r in json.loads(body) if r.get("model") == self.sc.model] if status == 200 else []
            if rows and all(r["ready"] and r.get("port") for r in rows):
                break
            if self.clock() > deadline:
                raise RuntimeError(f"fleet.kv_roles: the replicas at {self.base} were not all ready "
                                   f"after {READY_WAIT_PD:g} s")
            await asyncio.sleep(0.05)
        rows = await self.read_replicas(rows)
        pools: dict[str, list[Route]] = {"kv_producer": [], "kv_consumer": []}
        for r in rows:
            if r["ready"] and r.get("kv_role") in pools:
                pools[r["kv_role"]].append(self._routes[r["port"]])
        want = self.sc.pd
        got = (len(pools["kv_producer"]), len(pools["kv_consumer"]))
        if got != want:
            raise RuntimeError(
                f"fleet.kv_roles = \"{ratio_name(want)}\": the server at {self.base} has "
                f"{got[0]} prefill (kv_producer) and {got[1]} decode (kv_consumer) replicas ready "
                f"(start it with --replicas {sum(want)} --kv-roles {ratio_name(want)})")
        self.pd = PdRouter(pools["kv_producer"], pools["kv_consumer"], self.fleet.pd_policy)
        self.desired = len(rows)

    async def _pd_facts(self) -> dict:
        """The P/D layout and each decode replica's transfer counters, for the records."""
        decode = {}
        for route in self.pd.decode:
            counters = await self._scrape(route, decode_metrics)
            if counters is not None:
                decode[str(route.index)] = counters
        return {"kv_roles": ratio_name(self.sc.pd), "policy": self.pd.policy,
                "prefill_replicas": [r.index for r in self.pd.prefill],
                "decode_replicas": [r.index for r in self.pd.decode], "decode_metrics": decode}
