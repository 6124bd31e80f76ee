"""The runner's timeline (experiments.runner.Runner mixes it in): each action at its
modelled instant: capacity (to every serving replica of a fleet), a fault, a replica
count, the load's users or rate; recorded, with a progress line.

Faults: `fault` goes to POST /control/faults/replica (stall, slow, crash; its seconds
divided by the time scale, since the engine times them on the wall) or POST
/control/faults (errors); `clear` and the end of an `errors` fault reset both; the end of a
stall or a slowdown is the engine's own timer (the runner only marks it).

Knows the scenario's actions and the fault endpoints. Does not know how the load is sent.
"""

from __future__ import annotations

from inference_lab.experiments.scenario import END, REPLICA_KINDS, Action

__all__ = ["TimelineSide"]


class TimelineSide:
    """The timeline's half of the Runner (its attributes are set in Runner.__init__)."""

    async def apply_fault(self, fault: dict) -> None:
        """One fault action (scenario.FAULT_KEYS) as the server's control requests."""
        kind = fault["kind"]
        if kind in REPLICA_KINDS:
            body = {"fault": kind, "seconds": fault.get("seconds", 0.0) / self.k}
            if kind == "slow":
                body["factor"] = fault["factor"]
            if "replica" in fault:
                body["replica"] = fault["replica"]
            await self._post("/control/faults/replica", body)
        elif kind == "errors":
            await self._post("/control/faults", {k: v for k, v in fault.items()
                                                 if k not in ("kind", "seconds")})
        elif kind == "clear":
            await self.clear_faults()
        elif kind == END and fault["of"]["kind"] == "errors":
            await self._post("/control/faults", {"reset": True})
        elif kind == END and fault["of"]["kind"] == "slow" and self.virtual:
            await self._post("/control/faults/replica", {"fault": "clear"})
        # END of a stall or a slowdown: the engine's own timer ended it

    async def clear_faults(self) -> None:
        await self._post("/control/faults/replica", {"fault": "clear"})
        await self._post("/control/faults", {"reset": True})

    async def _apply(self, action: Action) -> None:
        if action.capacity:
            if self.fleet is not None:
                for route in list(self._routes.values()):
                    if any(p.index == route.index and not p.draining for p in self.pods):
                        await self.set_capacity(action.capacity, self._url(route))
            else:
                await self.set_capacity(action.capacity)
        if action.fault:
            await self.apply_fault(action.fault)
        if action.replicas is not None:
            await self.scale_to(action.replicas, {"action": action.describe()})
        if "num_concurrent_users" in action.load:
            self.users_target = action.load["num_concurrent_users"]
            self._ensure_users()
            self._wake()
        if "arrival_rate" in action.load:
            self.rate = action.load["arrival_rate"]
        self.phase += 1
        kind = "" if not action.fault else "fault_end" if action.fault["kind"] == END else "fault"
        self.records.action(self.now(), action.at, action.describe(), kind)
        self.progress(f"t={action.at:.1f}s: {action.describe()}")

    async def _timeline(self) -> None:
        for action in self.sc.timeline:
            await self._sleep_until(action.at)
            await self._apply(action)
