"""The experiment runner in-process against a real `inference-lab serve`: a release that
frees several slots wakes as many waiting users; a short closed loop records every
request, and while it runs the objects it keeps are out of the
collector's full passes (frozen at the start and at every scrape, unfrozen at the end
unless the process had frozen objects before),
so a full pass never has to scan a long run's records."""

from __future__ import annotations

import asyncio
import gc

from inference_lab.experiments import load as load_module
from inference_lab.experiments.controllers import FixedLimit, make_controller
from inference_lab.experiments.runner import Runner
from inference_lab.experiments.scenario import load_scenario
from inference_lab.testing.launch import serve
from scenario_text import closed_loop

SCENARIO = closed_loop("gc", 1.5, 4, limit=4, output=20, server="max_num_seqs = 4") + """
[[timeline]]
at = 0.5
load = { num_concurrent_users = 4 }
[[timeline]]
at = 1.0
load = { num_concurrent_users = 4 }
"""


async def test_records_stay_out_of_full_collections_while_the_run_goes(tmp_path):
    path = tmp_path / "gc.toml"
    path.write_text(SCENARIO)
    scenario = load_scenario(path)
    frozen_at_actions: list[tuple[int, int]] = []  # (frozen objects, rows kept so far)
    runner = None

    def progress(line: str) -> None:
        frozen_at_actions.append((gc.get_freeze_count(), len(runner.records._rows)))

    before = gc.get_freeze_count()
    with serve() as served:
        runner = Runner(scenario, served.base, make_controller("fixed", {"limit": 4}),
                        on_progress=progress)
        records = await asyncio.wait_for(runner.run(), 30)
    req = records.req
    # 4 users, ~20 ms per 20-token reply: dozens of requests in 1.5 s, every one a 200.
    assert len(req["status"]) >= 20 and set(req["status"]) == {200}
    (first, rows_first), (second, rows_second) = frozen_at_actions
    # Frozen from the start (start-up objects), and more frozen by 1.0 s than at 0.5 s:
    # the scrapes in between froze what the run kept meanwhile.
    assert first > before and rows_first > 0
    assert second > first and rows_second > rows_first
    # Unfrozen when the run ended; a process that had frozen objects of its own before
    # (the suite's in-process gateways do) keeps them, and the run's, frozen.
    assert gc.get_freeze_count() == 0 if before == 0 else gc.get_freeze_count() >= before


class OneThenFour(FixedLimit):
    """A limit of 1 until the first sample, then 4: three slots free up at one release."""

    def __init__(self) -> None:
        super().__init__(1)

    def on_sample(self, ticket, now, rtt, dropped) -> None:
        self._limit = 4


async def test_a_release_that_frees_several_slots_wakes_as_many_waiting_users(tmp_path, monkeypatch):
    # No periodic re-check to fall back on within the run: only the release can wake them.
    monkeypatch.setattr(load_module, "SLOT_RECHECK", 30.0)
    path = tmp_path / "jump.toml"
    path.write_text(SCENARIO.replace('duration = 1.5', 'duration = 1.0'))
    with serve() as served:
        runner = Runner(load_scenario(path), served.base, OneThenFour())
        req = (await asyncio.wait_for(runner.run(), 30)).req
    first_done, second_done = sorted(req["done_s"])[:2]
    # User 0 alone until its reply; then it and the three waiters, all at that release:
    # each waiter sent before any other reply came (woken one per release, the third
    # would have waited for the third reply).
    assert [u for u, s in zip(req["user"], req["send_s"]) if s < first_done] == [0]
    assert set(req["user"]) == {0, 1, 2, 3}
    waiters_sent = [min(s for u, s in zip(req["user"], req["send_s"]) if u == user) for user in (1, 2, 3)]
    assert all(first_done <= s < second_done for s in waiters_sent)
    assert max(req["inflight"]) == 4
