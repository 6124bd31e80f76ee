"""A real router in front: HAProxy (Debian's haproxy, deploy/haproxy/haproxy.cfg as
shipped) with leastconn before three replicas of `serve --replicas 3`. Requests spread
over all three; a replica driven into saturation answers 529 through HAProxy with its
status and body unchanged while the other two keep serving 200."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from inference_lab.common.ports import free_port
from inference_lab.testing.launch import serve
from inference_lab.testing.poll import wait_until
from system_tools import tool

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
SATURATED = {"error": {
    "message": "Server is at capacity: 1 requests waiting (max_waiting = 1). "
               "Retry with reduced concurrency.",
    "type": "overloaded_error", "code": "queue_saturated"}}
pytestmark = [pytest.mark.tools("haproxy"), pytest.mark.timeout(120)]


def post(port: int, body: dict, timeout: float = 30) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body),
                     headers={"content-type": "application/json"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _capacity(port: int) -> dict:
    """The replica's live capacity entry (GET /control/capacity)."""
    status, raw = get(port, "/control/capacity")
    assert status == 200
    return json.loads(raw)[0]


def get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def finished(port: int) -> float:
    """Requests the replica behind `port` finished (its own /metrics)."""
    text = get(port, "/metrics")[1].decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{"))


@contextlib.contextmanager
def haproxy(front: int, base: int):
    env = {**os.environ, "FRONT_PORT": str(front), "LAB_HOST": "127.0.0.1",
           **{f"REPLICA{i}_PORT": str(base + i) for i in range(3)}}
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([tool("haproxy"), "-db", "-f", str(CONFIG)], env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:

        def routes_to_all() -> bool:  # listening, and every replica's health check has passed
            assert proc.poll() is None, "haproxy exited"
            with contextlib.suppress(OSError):
                return {post(front, {"model": "gpt-oss-20b", "prompt": "x", "max_tokens": 1})[1]
                        .get("x-lab-replica") for _ in range(6)} == {"r0", "r1", "r2"}
            return False

        wait_until(routes_to_all, timeout=20, interval=0.1,
                   what="haproxy routing to all three replicas")
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_leastconn_spreads_concurrent_requests_over_all_three_replicas():
    with serve("--replicas", "3", ports=3) as served:
        front = free_port()
        with haproxy(front, served.port):
            before = [finished(served.port + i) for i in range(3)]
            body = {"model": "gpt-oss-20b", "prompt": "x", "max_tokens": 300}
            with ThreadPoolExecutor(12) as pool:
                results = list(pool.map(lambda _: post(front, body), range(12)))
            assert [status for status, _, _ in results] == [200] * 12
            by_replica = {}
            for _, headers, _ in results:
                by_replica[headers["x-lab-replica"]] = by_replica.get(headers["x-lab-replica"], 0) + 1
            assert set(by_replica) == {"r0", "r1", "r2"}
            assert max(by_replica.values()) <= 6, by_replica  # 12 at once: none takes half
            after = [finished(served.port + i) for i in range(3)]
            assert [a - b for a, b in zip(after, before)] == [by_replica[f"r{i}"] for i in range(3)]

            # replica 1 saturated (one running, one waiting, max_waiting 1) behind HAProxy's back
            conn = http.client.HTTPConnection("127.0.0.1", served.port + 1, timeout=10)
            conn.request("POST", "/control/capacity", body='{"max_num_seqs": 1, "max_waiting": 1}',
                         headers={"content-type": "application/json"})
            assert conn.getresponse().status == 200
            conn.close()
            hold = {"model": "gpt-oss-20b", "prompt": "x", "max_tokens": 20000, "stream": True}
            holders = []
            for _ in range(2):
                h = http.client.HTTPConnection("127.0.0.1", served.port + 1, timeout=30)
                h.request("POST", "/v1/completions", body=json.dumps(hold),
                          headers={"content-type": "application/json"})
                assert h.getresponse().status == 200  # admitted: headers come after admission
                holders.append(h)
                if len(holders) == 1:
                    # admitted is not yet running: until a step schedules it, the first holder
                    # is the one request the waiting queue holds, and the second would be refused
                    wait_until(lambda: _capacity(served.port + 1)["running"] == 1,
                               what="the first holder running")
            try:
                direct = post(served.port + 1, {"model": "gpt-oss-20b", "prompt": "x",
                                                "max_tokens": 5})
                assert direct[0] == 529
                seen = {}
                for _ in range(9):  # one at a time: leastconn takes turns among idle servers
                    status, headers, raw = post(front, {"model": "gpt-oss-20b", "prompt": "x",
                                                        "max_tokens": 5})
                    replica = headers["x-lab-replica"]
                    seen.setdefault(replica, []).append(status)
                    if replica == "r1":
                        assert status == 529
                        assert headers["content-type"].startswith("application/json")
                        assert json.loads(raw) == SATURATED
                        assert raw == direct[2]  # byte for byte what the replica said
                    else:
                        assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 5
                assert set(seen) == {"r0", "r1", "r2"}, seen
            finally:
                for h in holders:
                    h.close()
