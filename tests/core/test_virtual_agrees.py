"""Virtual time and the served lab answer alike: the same scale requests give the same rows
of /control/replicas (the served engine's Fleet against the virtual lab, on one clock),
a refusal reads as the gateway renders the engine's refusal, and the series the virtual
lab exposes are the served engine's, with the same HELP and TYPE lines."""

from __future__ import annotations

import asyncio
import json

from prometheus_client.parser import text_string_to_metric_families

from inference_lab.common.control_rows import replica_row
from inference_lab.engine.fleet.replicas import Fleet
from inference_lab.engine.fleet.rules import ReplicaUnavailable
from inference_lab.engine.metrics.exposition import MetricsRegistry
from inference_lab.engine.sim.core import EngineCore, QueueSaturated
from inference_lab.experiments.prompts import Prompt
from inference_lab.experiments.virtual import BASE_PORT, VirtualBackend, VirtualLab
from inference_lab.gateway.errors import envelope, from_rejected
from inference_lab.testing.poll import until
from factories import deployment
from virtual_helpers import overfill, run, send_at

BASE = f"http://virtual:{BASE_PORT}"
STARTUP_S = 20.0


class IdleRuntime:
    """What the served Fleet needs of a replica's runtime, holding no request."""

    def start(self) -> None:
        pass

    def open_streams(self) -> int:
        return 0

    async def drained(self) -> None:
        pass

    async def stop(self) -> None:
        pass


def served_rows(fleet: Fleet) -> list[dict]:
    """The rows the served lab shows for an idle fleet (the gateway's replica_row of each
    replica's status, as the engine reports it)."""
    return [replica_row(s.model, s.replica, BASE_PORT + s.replica, s.starting, s.draining,
                        s.ready_in_s, 0, 0) for s in fleet.statuses()]


def test_the_same_scale_requests_give_the_same_rows_served_and_virtual():
    dep = deployment()
    plan = [(0.0, 3), (5.0, 1), (8.0, 4), (30.0, 0), (31.0, 2), (45.0, 65), (60.0, 5)]

    async def main(loop):
        fleet = Fleet([dep], lambda d, i: IdleRuntime(), lambda d: STARTUP_S)
        lab = VirtualLab(loop, dep, replicas=0, startup_delay=STARTUP_S)
        http = VirtualBackend(lab).http
        seen = []
        for at, count in plan:
            await asyncio.sleep(at - loop.time())  # (virtual: the plan's instants)
            status, body = await http.request("POST", BASE + "/control/replicas",
                                              {"replicas": count})
            try:
                fleet.scale(dep.name, count)
                served = (200, None)
            except ValueError as exc:
                served = (400, str(exc))
            if status != 200:
                assert (status, json.loads(body)["error"]["message"]) == served
                continue
            await until(lambda: not any(r.draining for r in fleet), what="drains closed")
            virtual = (await http.request("GET", BASE + "/control/replicas"))[1]
            seen.append((loop.time(), json.loads(virtual)))
            assert json.loads(virtual) == served_rows(fleet)
        return seen

    seen, _ = run(main)
    assert [len(rows) for _, rows in seen] == [3, 1, 4, 0, 2, 5]
    assert [r["ready"] for r in seen[-1][1]] == [True, True, False, False, False]


def test_a_refusal_reads_as_the_gateway_renders_the_engines():
    dep = deployment(max_num_seqs=1, max_waiting=1)

    async def main(loop):
        fleet = Fleet([dep], lambda d, i: IdleRuntime(), lambda d: STARTUP_S)
        fleet.scale(dep.name, 1)
        lab = VirtualLab(loop, dep, replicas=0, startup_delay=STARTUP_S)
        lab.scale(1)
        endpoint = VirtualBackend(lab).endpoint(BASE)
        starting = await (await endpoint.connect()).send(endpoint.build(Prompt(None, 10, ""), 5, 0))
        try:
            fleet.lookup(dep.name, 0)
        except ReplicaUnavailable as exc:
            refused = from_rejected(14, exc.reason, str(exc), {})  # UNAVAILABLE
        await until(lambda: lab.rows()[0]["ready"], what="replica 0 ready")
        full = await (await overfill(lab, endpoint, 0, serial=1))[2]
        return starting, refused, full

    (starting, refused, full), _ = run(main)
    assert starting.status == refused.spec.status == 503
    assert starting.error == envelope(refused).decode()
    assert json.loads(starting.error)["error"]["type"] == "server_error"
    saturated = from_rejected(8, "QUEUE_SATURATED", str(QueueSaturated(dep.name, 1, 1)), {})
    assert full.status == saturated.spec.status == 529
    assert full.error == envelope(saturated).decode()


def _heads(text: str) -> set[str]:
    return {line for line in text.splitlines() if line.startswith(("# HELP", "# TYPE"))}


def _families(text: str) -> dict[str, tuple]:
    return {f.name: (f.documentation, f.type, {tuple(sorted(s.labels)) for s in f.samples})
            for f in text_string_to_metric_families(text)}


def test_the_virtual_lab_exposes_the_served_engines_series():
    dep = deployment(max_num_seqs=4)
    arrivals = [(0.01 * i, 50 + i, 8) for i in range(12)]

    async def main(loop):
        results, lab = await send_at(loop, arrivals, VirtualLab(loop, dep))
        return results, (await VirtualBackend(lab).http.request("GET", BASE + "/metrics"))[1]

    (results, text), _ = run(main)
    text = text.decode()
    assert [r.status for r in results] == [200] * len(arrivals)
    served = MetricsRegistry([EngineCore(dep)]).render().decode()
    assert _heads(text) and _heads(text) <= _heads(served)
    ours, theirs = _families(text), _families(served)
    assert ours.keys() <= theirs.keys()
    for name, (doc, kind, labels) in ours.items():
        assert (doc, kind) == theirs[name][:2], name
        assert labels <= theirs[name][2] or not theirs[name][2], name
    # the update points ran: every request finished (length) with its tokens counted
    samples = {(s.name, s.labels.get("finished_reason")): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("vllm:request_success_total", "length")] == len(arrivals)
    assert samples[("vllm:generation_tokens_total", None)] == 8 * len(arrivals)
    assert samples[("vllm:time_to_first_token_seconds_count", None)] == len(arrivals)
