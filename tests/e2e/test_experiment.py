"""`inference-lab experiment` end to end: a short scenario against a private server at
--time-scale 2 produces per-request records, queue gauges, a summary with the oracle
(the fixed controller at the oracle's concurrency scores ~1) and a report that headless
Chromium renders with its images and no console error; `compare` puts runs side by side."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from scenario_text import closed_loop
from system_tools import tool

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
ROOT = Path(__file__).resolve().parents[2]

# 8 users behind a fixed limit of 8 on max_num_seqs 8: exactly the oracle's concurrency.
# The action raises max_num_seqs to 16, which leaves the oracle at min(8 users, 16) = 8.
SCENARIO = closed_loop("short", 8, 8, limit=8, window=1.0, server="max_num_seqs = 8\nmax_waiting = 0",
                       more="[[timeline]]\nat = 4\ncapacity = { max_num_seqs = 16 }")


def experiment(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "inference_lab", "experiment", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def served_run(tmp_path: Path, text: str) -> tuple[Path, subprocess.CompletedProcess]:
    """The scenario `text` run with --serve --time-scale 2: its directory and the command."""
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(text)
    out = tmp_path / "run"
    done = experiment(str(scenario), "--serve", "--time-scale", "2", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    return out, done


def rows(out: Path) -> dict:
    import numpy as np

    return {k: np.array(v) for k, v in pq.read_table(out / "requests.parquet").to_pydict().items()}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("experiment")
    scenario = where / "short.toml"
    scenario.write_text(SCENARIO)
    out = where / "run"
    done = experiment(str(scenario), "--serve", "--time-scale", "2", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "phase 1 (max_num_seqs=16)" in done.stdout
    return out


def test_every_request_is_a_record_with_client_and_modelled_times(run_dir):
    table = pq.read_table(run_dir / "requests.parquet").to_pydict()
    n = len(table["status"])
    # 8 users, ~0.1-0.2 s per 100-token reply at batch 8: several hundred in 8 modelled s.
    assert 200 < n < 2000
    assert set(table["status"]) == {200}
    assert set(table["completion_tokens"]) == {100}
    assert max(table["inflight"]) == 8 and set(table["limit"]) == {8.0}
    assert {u for u in table["user"]} == set(range(8))
    for e2e, modelled in zip(table["e2e_s"], table["m_e2e_s"]):
        assert modelled > 0 and e2e >= modelled * 0.9  # a client never sees it sooner
    assert all(0 < t < e for t, e in zip(table["ttft_s"], table["e2e_s"]))


def test_queue_gauges_are_scraped_every_250_ms(run_dir):
    server = pq.read_table(run_dir / "server.parquet").to_pydict()
    # 4 wall seconds at 4 scrapes a second, allowing for a busy machine.
    assert len(server["t"]) >= 8
    assert set(server["max_num_seqs"]) == {8.0, 16.0}
    assert max(server["running"]) <= 16 and max(server["running"]) >= 6
    times = server["t"]
    assert all(b > a for a, b in zip(times, times[1:]))


def test_summary_scores_the_fixed_controller_at_the_oracle_concurrency_near_one(run_dir):
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["controller"] == "fixed" and summary["time_scale"] == 2.0
    assert [p["start_s"] for p in summary["phases"]] == [0.0, 4.0]
    for phase in summary["phases"]:
        assert phase["oracle"]["concurrency"] == 8
        assert phase["steady"]["frac_529"] == 0.0
        assert phase["steady"]["limit_p50"] == 8.0
        assert phase["scores"]["settle_s"] == 0.0
        # ~1; the margin is for HTTP time (x2 at time scale 2) on a busy machine.
        assert 0.75 < phase["scores"]["goodput"] < 1.25, phase
        assert 0.9 < phase["scores"]["e2e_p50"] < 1.4, phase
        assert math.isclose(phase["oracle"]["goodput_tok_s"],
                            summary["phases"][0]["oracle"]["goodput_tok_s"])


@pytest.mark.tools("chromium")
def test_the_report_renders_in_headless_chromium_with_its_images(run_dir, tmp_path):
    from playwright.sync_api import sync_playwright

    report = run_dir / "report.html"
    text = report.read_text()
    assert "http://" not in text and "https://" not in text  # self-contained
    assert text.count("data:image/png;base64,") == 4
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=tool("chromium"), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(report.as_uri())
            images = page.evaluate(
                "Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert errors == []
    assert len(images) == 4 and all(ok and w > 300 and h > 100 for ok, w, h in images)
    assert shot.stat().st_size > 20_000  # a page of plots, not a blank one


def test_compare_puts_runs_side_by_side(run_dir, tmp_path):
    out = tmp_path / "cmp"
    done = experiment("compare", str(run_dir), str(run_dir), "--out", str(out))
    assert done.returncode == 0, done.stderr
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and "Comparison of 2 runs" in page
    assert len(json.loads((out / "summary.json").read_text())["runs"]) == 2


@pytest.mark.parametrize("args, message", [
    (["nope.toml", "--serve", "--out", "x"], "nope.toml: cannot read"),
    (["configs/experiments/reference-page.toml", "--out", "x"], "give --url URL"),
    (["configs/experiments/reference-page.toml", "--serve", "--out", "x", "--controller", "pid"],
     "unknown controller 'pid'"),
    (["configs/experiments/reference-page.toml", "--serve", "--out", "x", "--param", "bogus=1"],
     "has no parameter 'bogus'"),
    (["compare", "--out", "x"], "give one or more run directories"),
])
def test_bad_input_is_one_line_and_exit_status_2(args, message):
    done = experiment(*args, timeout=30)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


# Poisson arrivals at about twice what max_num_seqs 2 drains, max_waiting 2: the server
# refuses (529) and AIMD backs off until it sheds arrivals on the client.
OVERLOAD = """
name = "overload"
duration = 6
server = { max_num_seqs = 2, max_waiting = 2 }
controller = { name = "aimd", params = { min_limit = 1 } }
timeline = [{ at = 3, load = { arrival_rate = 20.0 } }]
[load]
arrival_pattern = "poisson"
arrival_rate = 150.0
input_len_dist = { type = "fixed", value = 16 }
output_len_dist = { type = "fixed", value = 50 }
"""


def test_an_open_loop_overload_gets_529s_and_aimd_sheds_arrivals(tmp_path):
    out, _ = served_run(tmp_path, OVERLOAD)
    table = pq.read_table(out / "requests.parquet").to_pydict()
    status = table["status"]
    assert status.count(529) > 10 and status.count(0) > 10 and status.count(200) > 50
    assert all('"queue_saturated"' in e for s, e in zip(status, table["error"]) if s == 529)
    assert all(u == -1 for u in table["user"])
    summary = json.loads((out / "summary.json").read_text())
    first, second = summary["phases"]
    assert first["oracle"]["kind"] == "open_loop_overloaded" and second["oracle"]["kind"] == "open_loop"
    # Down from its initial 20 to around max_num_seqs + max_waiting = 4 (at such small
    # limits int(limit x 0.9) and +1 per success keep it a few above).
    assert first["steady"]["limit_p50"] <= 10
    assert second["steady"]["frac_529"] < first["steady"]["frac_529"]
    # The controller's feedback delay: a 529 comes back before any stream could end (it is
    # refused before any byte), and the streams' ends reached the client after the engine's.
    st = first["steady"]
    assert 0 < st["refusal_rtt_p50_s"] <= st["refusal_rtt_p99_s"]
    assert st["refusal_rtt_p50_s"] < st["e2e_p50_s"]
    assert st["delivery_lag_p99_s"] > 0


def test_url_drives_a_running_server_and_reads_its_queue_from_control_capacity(tmp_path):
    from inference_lab.testing.launch import serve

    scenario = tmp_path / "url.toml"
    # A slowdown and injected errors with no end: the run clears them when it ends.
    scenario.write_text(SCENARIO.replace("duration = 8", "duration = 2").replace("at = 4", "at = 1")
                        + '[[timeline]]\nat = 1.5\nfault = { kind = "slow", factor = 2 }\n'
                        + '[[timeline]]\nat = 1.9\nfault = { kind = "errors", retry_after = 1 }\n')
    out = tmp_path / "run"
    with serve() as served:
        done = experiment(str(scenario), "--url", served.base, "--out", str(out))
        replica = json.load(urllib.request.urlopen(served.base + "/control/faults/replica"))
        faults = json.load(urllib.request.urlopen(served.base + "/control/faults"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert replica["slow_factor"] == 1.0 and replica["slow_for_s"] == 0
    assert faults["defaults"]["retry_after"] is None, faults
    server = pq.read_table(out / "server.parquet").to_pydict()
    assert len(server["t"]) >= 4 and set(server["max_num_seqs"]) == {8.0, 16.0}
    assert set(pq.read_table(out / "requests.parquet").column("status").to_pylist()) == {200}


# Faults on the timeline (4 wall seconds at time scale 2): steps 3x slower from 2 to 4 s,
# half the requests an injected 503 from 4.5 to 5.5 s, a stall from 6 to 7 s.
FAULTS = closed_loop("faults", 8, 8, limit=8, output=50, window=0.5, server="max_num_seqs = 8",
                     load="retry_after_529 = 0.0") + """
[[timeline]]
at = 2
fault = { kind = "slow", factor = 3, seconds = 2 }
[[timeline]]
at = 4.5
fault = { kind = "errors", rate = 0.5, types = ["overloaded"], seed = 3, seconds = 1 }
[[timeline]]
at = 6
fault = { kind = "stall", seconds = 1 }
"""


def test_faults_on_the_timeline_reach_the_server_and_the_report(tmp_path):
    import numpy as np

    out, done = served_run(tmp_path, FAULTS)
    assert "t=2.0s: slow x3 for 2 s" in done.stdout and "t=7.0s: stall 1 s ends" in done.stdout
    req = rows(out)
    send, status, m_e2e = req["send_s"], req["status"], req["m_e2e_s"]
    # Modelled e2e triples while the steps run 3x slower (requests wholly inside it).
    before = np.median(m_e2e[(status == 200) & (send < 1.8)])
    slow = np.median(m_e2e[(status == 200) & (send > 2.2) & (req["done_s"] < 3.9)])
    assert 2.4 < slow / before < 3.6, (before, slow)
    # Injected 503s only while the errors fault holds (their bodies say so), ~half then.
    injected = status == 503
    assert all("injected fault" in e for e in req["error"][injected])
    assert injected.any() and np.all((send[injected] > 4.3) & (send[injected] < 5.8))
    in_window = (send > 4.6) & (send < 5.4)
    assert 0.25 < injected[in_window].mean() < 0.75
    # Nothing finishes during the stall (the modelled clock stops), all of it resumes.
    assert not np.any((req["done_s"] > 6.2) & (req["done_s"] < 6.9))
    assert set(status) == {200, 503}
    summary = json.loads((out / "summary.json").read_text())
    phases = {p["fault"]: p for p in summary["phases"]}
    assert set(phases) == {"", "slow x3", "errors 50 % overloaded for 1 s", "stall 1 s"}
    slow_oracle, free = phases["slow x3"]["oracle"], summary["phases"][0]["oracle"]
    assert slow_oracle["fault_modelled"] and not phases["stall 1 s"]["oracle"]["fault_modelled"]
    assert 2.5 < slow_oracle["e2e_p50_s"] / free["e2e_p50_s"] < 3.5
    assert 0.6 < phases["slow x3"]["scores"]["goodput"] < 1.4
    kinds = [a["kind"] for a in json.loads((out / "actions.json").read_text())["actions"]]
    assert kinds == ["fault", "fault_end", "fault", "fault_end", "fault", "fault_end"]
    assert "slow x3 for 2 s" in (out / "report.html").read_text()


# Multi-turn chats on shared system prompts, half of the requests through a LoRA adapter:
# real distinct prompt text whose structure the server's prefix cache and the oracle's
# offline simulation both see.
MULTI_TURN = closed_loop("multi-turn", 6, 8, limit=0, prompt=64, output=32, server="max_num_seqs = 8",
                         load="shared_prefix_len = 256\nnum_shared_prefixes = 2\nnum_turns = 3\n"
                              "lora_adapters = { sql = 0.5 }\nseed = 9")


def test_multi_turn_prompts_hit_the_prefix_cache_as_the_oracle_predicts(tmp_path):
    import numpy as np

    out, done = served_run(tmp_path, MULTI_TURN)
    req = rows(out)
    assert set(req["status"]) == {200} and len(req["status"]) > 100
    assert set(req["adapter"]) == {"", "sql"} and 0.35 < np.mean(req["adapter"] == "sql") < 0.65
    # Turn 1 = 256 + 64 tokens; turn 2 adds its reply and a message (+96), turn 3 again.
    prompt, cached = req["prompt_tokens"], req["cached_tokens"]
    assert set(prompt) == {320, 416, 512}
    assert np.all(cached % 64 == 0) and np.all(cached < prompt)
    # A later turn on the adapter of the turn before finds at least that turn's prompt.
    assert np.mean(cached > 0) > 0.7 and cached[prompt == 512].max() >= 384
    summary = json.loads((out / "summary.json").read_text())
    (phase,) = summary["phases"]
    predicted, measured = phase["oracle"]["cache_hit_rate"], phase["whole"]["cached_frac"]
    assert predicted > 0.4 and abs(measured - predicted) < 0.08, (measured, predicted)
    assert "cached" in done.stdout


def test_a_crash_on_the_timeline_restarts_the_engine_and_the_run_carries_on(tmp_path):
    # `serve` restarts the engine (with its live capacity); the requests in between fail
    # fast (503) and the queue gauges come from /control/capacity once the engine's old
    # metrics port is gone. (Seven seconds after the crash: a restart is a new process,
    # seconds of imports on a loaded machine.)
    out, done = served_run(tmp_path, SCENARIO.replace("duration = 8", "duration = 9")
                           .replace("[[timeline]]\nat = 4\ncapacity = { max_num_seqs = 16 }",
                                    '[[timeline]]\nat = 2\nfault = { kind = "crash" }'))
    assert "t=2.0s: crash" in done.stdout
    req = rows(out)
    status, send = req["status"], req["send_s"]
    failed = status != 200
    assert failed.any() and set(status[failed]) <= {503, -1}
    assert send[failed].min() >= 1.9 and (send[status == 200] > send[failed].max()).any()
    server = pq.read_table(out / "server.parquet").to_pydict()
    after = [(t, m) for t, m in zip(server["t"], server["max_num_seqs"]) if t > send[failed].max()]
    assert after and all(m == 8.0 for _, m in after)  # scraped again, capacity restored
    assert json.loads((out / "summary.json").read_text())["phases"][1]["fault"] == "after a crash"


@pytest.mark.parametrize("name", ["../../../escaped", "a/b", ".hidden", "/abs", "tab\there"])
def test_an_adapter_name_that_is_not_a_plain_file_name_is_refused_and_nothing_is_written(
        tmp_path, name):
    """An experiment writes a directory per adapter under --out: a name such as
    `../../../x` would put it elsewhere, so the scenario is refused before anything runs."""
    scenario = tmp_path / "deep" / "er" / "scenario.toml"
    scenario.parent.mkdir(parents=True)
    scenario.write_text(MULTI_TURN.replace("lora_adapters = { sql = 0.5 }",
                                           f"lora_adapters = {{ {json.dumps(name)} = 0.5 }}"))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    done = experiment(str(scenario), "--serve", "--out", str(tmp_path / "deep" / "er" / "run"))
    assert done.returncode == 2 and "lora_adapters" in done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


DP_SERVED = closed_loop("dp-served", 6, 8, limit=8, window=1.0,
                        server="max_num_seqs = 4\nmax_waiting = 0\ndata_parallel_size = 2")


def test_a_served_scenario_of_two_ranks_runs_on_serve_data_parallel_size_2(tmp_path):
    # 8 users over 2 ranks of max_num_seqs 4 (set on both through the one port): every
    # user runs at once, none waits; the queue gauges read are the ranks' sums
    out, done = served_run(tmp_path, DP_SERVED)
    table = pq.read_table(out / "requests.parquet").to_pydict()
    assert set(table["status"]) == {200} and len(table["status"]) > 20
    server = pq.read_table(out / "server.parquet").to_pydict()
    assert set(server["max_num_seqs"]) == {8.0}  # 4 on each rank
    # (a request that just arrived waits for its rank's next step: at most one a rank in a
    # sample, and the gauge is the two ranks' sum)
    assert max(server["running"]) == 8 and max(server["waiting"]) <= 2
    phase, = json.loads((out / "summary.json").read_text())["phases"]
    # the oracle runs the same two ranks in lockstep (an MoE model), 4 users each, as the
    # served ranks had them; served, a step booked while the other rank's announcement
    # is on its way waits for the group's next boundary (docs/architecture.md): a few
    # per cent slower
    assert phase["steady"]["modelled_e2e_p50_s"] == pytest.approx(phase["oracle"]["e2e_p50_s"],
                                                                  rel=0.06)
