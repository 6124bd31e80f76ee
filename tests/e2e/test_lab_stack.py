"""The lab stack in deploy/ (docker-compose + Prometheus + Grafana), checked without Docker.

- the compose file validates with docker-compose v1 (`docker-compose config`);
- the Prometheus config passes `promtool check config`;
- the live /metrics of a real engine and a real gateway (subprocesses, as in the stack)
  pass `promtool check metrics`;
- a real Prometheus, using deploy/prometheus/prometheus.yml with its targets pointed at
  those processes, sees a saturated model: queue depth at max_waiting and rejections;
- every PromQL expression of the Grafana dashboard is accepted by that Prometheus and
  names only metrics the engine and gateway really expose; the dashboard's datasource is
  the provisioned one;
- Prometheus stores vLLM's `vllm:*` names: the engine answers in the classic text format
  whatever Prometheus asks for (prometheus-client's OpenMetrics output would rename them
  `vllm_*`, client_python#1177).

Every server listens on 127.0.0.1 on a free port and is stopped at the end of the module.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from metrics_helpers import promtool_check
from system_tools import tool
from inference_lab.common.ports import free_port
from inference_lab.testing.poll import until, wait_until

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
PROMETHEUS_YML = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "inference-lab.json"
DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources"

needs_promtool = pytest.mark.tools("promtool")
needs_prometheus = pytest.mark.tools("prometheus")
needs_compose = pytest.mark.tools("docker-compose")

MAX_WAITING = 4
STARTUP_TIMEOUT_S = 45.0   # a cold Python start on a busy 2-core CI machine
STOP_TIMEOUT_S = 15.0


# ---- helpers ------------------------------------------------------------------------------


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


class Process:
    """A server subprocess whose output goes to a log file (never a pipe that can fill)."""

    def __init__(self, name: str, argv: list[str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "wb")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env)

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, probe, what: str, timeout: float = STARTUP_TIMEOUT_S,
                   interval: float = 0.1) -> None:
        """Poll `probe()` (truthy = ready) until it holds; bounded in time."""
        def ready() -> bool:
            if self.proc.poll() is not None:
                pytest.fail(f"{self.name} exited with {self.proc.returncode} before {what}:\n"
                            f"{self.tail()}")
            try:
                return bool(probe())
            except (OSError, ValueError):
                return False

        try:
            wait_until(ready, timeout=timeout, interval=interval, what=what)
        except AssertionError:
            pytest.fail(f"{self.name}: no {what} within {timeout:.0f} s:\n{self.tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=STOP_TIMEOUT_S)
        self._log.close()


@dataclass
class Stack:
    grpc_port: int
    metrics_port: int
    gateway_port: int

    @property
    def engine_metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """`inference-lab engine` (embedded gpt-oss-20b, max_waiting 4) and `inference-lab gateway`
    in front of it, as two processes, the way the compose file runs them."""
    logs = tmp_path_factory.mktemp("lab-stack-logs")
    grpc_port, metrics_port, gateway_port = free_port(), free_port(), free_port()
    started: list[Process] = []
    try:
        engine = Process("engine", [
            sys.executable, "-P", "-m", "inference_lab", "engine", "--host", "127.0.0.1",
            "--port", str(grpc_port), "--metrics-port", str(metrics_port),
            "--max-waiting", str(MAX_WAITING), "--grace", "2"], logs)
        started.append(engine)
        s = Stack(grpc_port, metrics_port, gateway_port)
        engine.wait_ready(lambda: http_get(s.engine_metrics_url, 2)[0] == 200, "/metrics")
        gateway = Process("gateway", [
            sys.executable, "-P", "-m", "inference_lab", "gateway", "--engine",
            f"127.0.0.1:{grpc_port}", "--host", "127.0.0.1", "--port", str(gateway_port)], logs)
        started.append(gateway)
        gateway.wait_ready(lambda: http_get(f"{s.gateway_url}/health", 2)[0] == 200,
                           "200 on /health")
        yield s
    finally:
        for process in reversed(started):  # gateway first, then the engine
            process.stop()


def prometheus_config(stack: Stack) -> str:
    """deploy/prometheus/prometheus.yml with its compose targets pointed at the test stack."""
    text = PROMETHEUS_YML.read_text()
    for target, local in (("engine:50052", f"127.0.0.1:{stack.metrics_port}"),
                          ("gateway:8080", f"127.0.0.1:{stack.gateway_port}")):
        assert text.count(f'"{target}"') == 1, f"{PROMETHEUS_YML} should scrape {target} once"
        text = text.replace(f'"{target}"', f'"{local}"')
    return text


def prom_query(base: str, expr: str, timeout: float = 5.0) -> dict:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    code, body = http_get(url, timeout)
    try:
        return json.loads(body)
    except ValueError:
        return {"status": "error", "error": f"HTTP {code}: {body[:200]}"}


@pytest.fixture(scope="module")
def prometheus(stack, tmp_path_factory):
    """A real Prometheus scraping the test stack every second; yields its base URL once both
    targets have been scraped successfully."""
    work = tmp_path_factory.mktemp("prometheus")
    config = work / "prometheus.yml"
    config.write_text(prometheus_config(stack))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = Process("prometheus", [
        tool("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={work / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}"], work)
    try:
        process.wait_ready(lambda: http_get(f"{base}/-/ready", 2)[0] == 200, "/-/ready")

        def both_targets_up() -> bool:
            result = prom_query(base, "up == 1")
            jobs = {r["metric"].get("job") for r in result.get("data", {}).get("result", [])}
            return jobs >= {"engine", "gateway"}

        process.wait_ready(both_targets_up, "successful scrape of engine and gateway",
                           interval=0.25)
        yield base
    finally:
        process.stop()


def exposed_names(*urls: str) -> set[str]:
    """Every sample name the live expositions carry, plus the sample names of declared
    families that have no child yet (a labelled counter such as the rejections one has no
    sample before its first increment; Prometheus sees it as soon as it has)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "summary": ("_sum", "_count"), "gauge": ("",), "untyped": ("",)}
    names: set[str] = set()
    for url in urls:
        code, body = http_get(url)
        assert code == 200, f"GET {url} -> {code}"
        for family in text_string_to_metric_families(body):
            names.update(sample.name for sample in family.samples)
            names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    return names


# ---- PromQL of the dashboard --------------------------------------------------------------

PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                "and", "or", "unless", "offset", "inf", "nan", "atan2"}


def grafana_to_promql(expr: str) -> str:
    """Replace Grafana's variables with values Prometheus accepts."""
    expr = re.sub(r"\$\{?__(rate_)?interval\}?|\$\{?__range\}?", "1m", expr)
    return re.sub(r"\$\{?\w+(?::\w+)?\}?", ".*", expr)  # $model and friends: a regex


def promql_metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers that are not functions, keywords,
    label names in matchers or grouping clauses, ranges or string contents."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)  # strings
    e = re.sub(r"\{[^}]*\}", " ", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)  # ranges and subqueries
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"(?<![\w:.$])[A-Za-z_:][\w:]*", e):
        if e[m.end():].lstrip().startswith("("):
            continue  # a function call (or an aggregation)
        if m.group().lower() in PROMQL_WORDS:
            continue
        names.add(m.group())
    return names


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable of the dashboard."""
    dash = json.loads(DASHBOARD.read_text())
    found = []

    def walk(panels):
        for panel in panels:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    found.append((f"panel {panel.get('title')!r} {target.get('refId')}",
                                  target["expr"]))
            walk(panel.get("panels", []))

    walk(dash.get("panels", []))
    for var in dash.get("templating", {}).get("list", []):
        query = var.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        if var.get("type") == "query" and query:
            m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", query)
            found.append((f"variable ${var['name']}", m.group(1) if m else query))
    return found


def test_promql_metric_name_extraction():
    assert promql_metric_names(
        'histogram_quantile(0.99, sum by (le, model_name) (rate(vllm:e2e_request_latency_seconds_bucket'
        '{model_name=~"$model"}[$__rate_interval])))') == {"vllm:e2e_request_latency_seconds_bucket"}
    assert promql_metric_names(
        'sum(rate(a_total{status="529"}[1m])) / ignoring(x) group_left sum(b:c) offset 5m > bool 1e3'
    ) == {"a_total", "b:c"}


# ---- static checks ------------------------------------------------------------------------


# Grafana's admin password is required from the environment the stack starts in.
COMPOSE_ENV = {**{k: v for k, v in os.environ.items()
                  if k not in ("HARDWARE", "GRAFANA_ADMIN_PASSWORD")},
               "GRAFANA_ADMIN_PASSWORD": "gf-lab-example"}


def compose_config(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([tool("docker-compose"), "-f", str(COMPOSE_FILE), "config", *args], cwd=ROOT,
                          env=COMPOSE_ENV if env is None else env, capture_output=True,
                          text=True, timeout=120)


@needs_compose
def test_docker_compose_config_validates():
    env = COMPOSE_ENV
    run = subprocess.run([tool("docker-compose"), "-f", str(COMPOSE_FILE), "config"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert re.search(r"- --hardware\s+- b200\s", run.stdout)  # ${HARDWARE:-b200}
    services = subprocess.run([tool("docker-compose"), "-f", str(COMPOSE_FILE), "config", "--services"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert services.returncode == 0, services.stderr
    assert set(services.stdout.split()) == {"engine", "gateway", "prometheus", "grafana"}
    h200 = subprocess.run([tool("docker-compose"), "-f", str(COMPOSE_FILE), "config"], cwd=ROOT,
                          env=dict(env, HARDWARE="h200"), capture_output=True, text=True,
                          timeout=120)
    assert h200.returncode == 0 and re.search(r"- --hardware\s+- h200\s", h200.stdout)


def load_yaml(text: str):
    """PyYAML when this interpreter has it; otherwise the one docker-compose v1 (a Python
    script) runs on, which always has it."""
    try:
        import yaml
    except ImportError:
        shebang = Path(tool("docker-compose")).read_text(errors="replace").splitlines()[0]
        if not shebang.startswith("#!") or "python" not in shebang:
            pytest.skip("PyYAML not importable and docker-compose is not a Python script")
        convert = subprocess.run(
            shebang[2:].split() + ["-c", "import json, sys, yaml; "
                                   "json.dump(yaml.safe_load(sys.stdin), sys.stdout)"],
            input=text, capture_output=True, text=True, timeout=60)
        assert convert.returncode == 0, convert.stderr
        return json.loads(convert.stdout)
    return yaml.safe_load(text)


def published(service: dict) -> set[tuple[str, int]]:
    """(host address, port) of each port a service publishes, in either of docker-compose
    config's forms ("HOST:PUBLISHED:TARGET/tcp", or a mapping; no address: every one)."""
    out = set()
    for port in service.get("ports", []):
        if isinstance(port, dict):
            out.add((port.get("host_ip", "0.0.0.0"), int(port["published"])))
        else:
            parts = port.split("/")[0].split(":")
            host = parts[0] if len(parts) == 3 else "0.0.0.0"
            out.add((host, int(parts[-2] if len(parts) >= 2 else parts[-1])))
    return out


@needs_compose
def test_docker_compose_publishes_only_on_loopback_and_takes_every_secret_from_the_environment():
    secrets = {"INFERENCE_LAB_API_KEY": "sk-lab-example", "INFERENCE_LAB_CONTROL_TOKEN": "ct-lab-ex"}
    run = compose_config(env={**COMPOSE_ENV, **secrets})
    assert run.returncode == 0, run.stderr
    services = load_yaml(run.stdout)["services"]
    for name, service in services.items():
        assert {host for host, _ in published(service)} == {"127.0.0.1"}, name
    for name in ("engine", "gateway"):  # the engine checks both (docs/security.md)
        assert {k: services[name]["environment"][k] for k in secrets} == secrets, name
    assert services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == "gf-lab-example"
    assert not any("lifecycle" in arg for arg in services["prometheus"]["command"])
    # Grafana's admin password has no default: the stack refuses to start without one.
    unset = compose_config(env={k: v for k, v in COMPOSE_ENV.items()
                                if k != "GRAFANA_ADMIN_PASSWORD"})
    assert unset.returncode != 0 and "GRAFANA_ADMIN_PASSWORD" in unset.stderr


@needs_compose
def test_docker_compose_services_are_wired_as_documented():
    run = compose_config()
    assert run.returncode == 0, run.stderr
    services = load_yaml(run.stdout)["services"]
    ports = {name: published(svc) for name, svc in services.items()}
    assert ports == {"engine": {("127.0.0.1", 50051)}, "gateway": {("127.0.0.1", 8080)},
                     "prometheus": {("127.0.0.1", 9090)}, "grafana": {("127.0.0.1", 3000)}}
    for name in ("engine", "gateway"):
        assert Path(services[name]["build"]["context"]) == ROOT
        assert services[name]["build"]["dockerfile"] == "deploy/Dockerfile"
        assert services[name]["healthcheck"]["test"][0] == "CMD"
    engine = services["engine"]["command"]
    assert engine[0] == "engine" and engine[engine.index("--metrics-port") + 1] == "50052"
    assert engine[engine.index("--host") + 1] == "0.0.0.0"
    assert "grpc_health" in " ".join(services["engine"]["healthcheck"]["test"])
    gateway = services["gateway"]["command"]
    assert gateway[:3] == ["gateway", "--engine", "engine:50051"]
    assert "/health" in " ".join(services["gateway"]["healthcheck"]["test"])
    assert services["gateway"]["depends_on"]["engine"]["condition"] == "service_healthy"
    mounts = {v.split(":")[0]: v.split(":")[1] for v in services["prometheus"]["volumes"]}
    assert mounts[str(PROMETHEUS_YML)] == "/etc/prometheus/prometheus.yml"
    mounts = {v.split(":")[0]: v.split(":")[1] for v in services["grafana"]["volumes"]}
    assert mounts[str(DEPLOY / "grafana" / "provisioning")] == "/etc/grafana/provisioning"
    assert mounts[str(DEPLOY / "grafana" / "dashboards")] == "/var/lib/grafana/dashboards"


def test_dockerfile_runs_any_subcommand_with_baked_configs():
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim", text, re.M)
    assert re.search(r'^ENTRYPOINT \["inference-lab"\]', text, re.M)
    assert re.search(r"^COPY configs /app/configs", text, re.M)
    assert re.search(r"^RUN pip install \.", text, re.M)


@needs_promtool
def test_promtool_check_config():
    run = subprocess.run([tool("promtool"), "check", "config", str(PROMETHEUS_YML)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout + run.stderr


def test_grafana_provisioning_points_at_the_dashboard_datasource():
    text = "\n".join(p.read_text() for p in sorted(DATASOURCES.glob("*.yml")))
    uids = set(re.findall(r"^\s*uid:\s*(\S+)", text, re.M))
    assert "http://prometheus:9090" in text
    dash = json.loads(DASHBOARD.read_text())
    used = set()

    def walk(node):
        if isinstance(node, dict):
            ds = node.get("datasource")
            if isinstance(ds, dict) and "uid" in ds:
                used.add(ds["uid"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(dash)
    assert used and used <= uids, f"dashboard uses datasource uids {used}, provisioned {uids}"


# ---- the live engine and gateway ----------------------------------------------------------

@needs_promtool
@pytest.mark.parametrize("target", ["engine", "gateway"])
def test_promtool_check_metrics_on_live_exposition(stack, target):
    url = stack.engine_metrics_url if target == "engine" else f"{stack.gateway_url}/metrics"
    code, body = http_get(url)
    assert code == 200 and body.strip()
    _, problems = promtool_check(body)  # vLLM's own names are the only findings
    assert not problems, "\n".join(problems)
    assert "vllm:num_requests_waiting{" in body  # the gateway's API port too, as vLLM's
    if target == "gateway":
        assert "inference_lab_gateway_http_requests_total" in body


# What Prometheus 2.x sends (no `escaping=`): it would get OpenMetrics if the engine negotiated.
PROMETHEUS_2_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                       "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def test_engine_openmetrics_exposition_keeps_vllm_names(stack):
    """The names a Prometheus 2.x scrape gets from the engine: text format, colons kept."""
    request = urllib.request.Request(stack.engine_metrics_url,
                                     headers={"Accept": PROMETHEUS_2_ACCEPT})
    with urllib.request.urlopen(request, timeout=5) as resp:
        body = resp.read().decode()
        assert resp.headers["Content-Type"].startswith("text/plain")
    samples = {line.split("{")[0].split(" ")[0] for line in body.splitlines()
               if line and not line.startswith("#")}
    assert "vllm:num_requests_waiting" in samples
    assert not [s for s in samples if s.startswith("vllm_")]


@needs_prometheus
def test_prometheus_stores_vllm_names_with_colons(prometheus):
    code, body = http_get(f"{prometheus}/api/v1/label/__name__/values")
    assert code == 200
    names = set(json.loads(body)["data"])
    assert {"vllm:num_requests_waiting", "vllm:time_to_first_token_seconds_bucket",
            "vllm:generation_tokens_total", "inference_lab_max_waiting"} <= names
    assert not [n for n in names if n.startswith("vllm_")]


@needs_prometheus
def test_dashboard_queries_parse_and_name_live_metrics(stack, prometheus):
    live = exposed_names(stack.engine_metrics_url, f"{stack.gateway_url}/metrics")
    queries = dashboard_queries()
    assert len(queries) >= 10
    used: set[str] = set()
    for where, expr in queries:
        result = prom_query(prometheus, grafana_to_promql(expr))
        assert result.get("status") == "success", f"{where}: {expr}: {result.get('error')}"
        names = promql_metric_names(expr)
        assert names, f"{where}: no metric name found in {expr}"
        unknown = names - live
        assert not unknown, f"{where}: {sorted(unknown)} not exposed by the engine or gateway"
        used |= names
    required = {
        "vllm:num_requests_waiting", "vllm:num_requests_running", "inference_lab_max_waiting",
        "inference_lab_max_num_seqs", "inference_lab_gateway_http_requests_total",
        "inference_lab_rejections_total", "vllm:time_to_first_token_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket", "vllm:generation_tokens_total",
        "inference_lab_pacing_lag_seconds_bucket", "vllm:kv_cache_usage_perc",
    }
    assert required <= used, f"dashboard lacks panels over {sorted(required - used)}"


# ---- end to end: saturation seen through Prometheus --------------------------------------

CLIENTS = 30
LOAD_TIMEOUT_S = 25.0  # the load runs until Prometheus shows saturation, at most this long
POLL_S = 0.5


async def _query_value(session: aiohttp.ClientSession, base: str, expr: str) -> float | None:
    async with session.get(f"{base}/api/v1/query", params={"query": expr}) as resp:
        body = await resp.json()
    result = body.get("data", {}).get("result", [])
    return float(result[0]["value"][1]) if result else None


@needs_prometheus
async def test_saturation_is_visible_in_prometheus(stack, prometheus):
    gateway = stack.gateway_url
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=30)
    refusals: list[tuple[str, dict]] = []
    statuses: dict[int, int] = {}
    stop = asyncio.Event()

    async def client(session: aiohttp.ClientSession) -> None:
        """A closed-loop client: stream a long completion; when refused, retry shortly."""
        body = {"model": "gpt-oss-20b", "stream": True, "max_tokens": 2000,
                "messages": [{"role": "user", "content": "Tell me a long story."}]}
        while not stop.is_set():
            async with session.post(f"{gateway}/v1/chat/completions", json=body) as resp:
                statuses[resp.status] = statuses.get(resp.status, 0) + 1
                if resp.status == 200:
                    async for _ in resp.content:
                        pass
                    continue
                text = await resp.text()
                if resp.status == 529:
                    refusals.append((resp.content_type, json.loads(text)))
            await asyncio.sleep(0.25)  # the client's own pause before it retries: the load shape

    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.post(f"{gateway}/control/capacity",
                                json={"max_num_seqs": 1, "max_waiting": MAX_WAITING}) as resp:
            assert resp.status == 200, await resp.text()
            state = await resp.json()
        assert [(m["max_num_seqs"], m["max_waiting"]) for m in state] == [(1, MAX_WAITING)]

        queries = {
            "peak_waiting": "max(max_over_time(vllm:num_requests_waiting[1m]))",
            "rejections": "sum(inference_lab_rejections_total)",
            "gateway_529": 'sum(inference_lab_gateway_http_requests_total{status="529"})',
            "max_num_seqs": "max(inference_lab_max_num_seqs)",
            "max_waiting": "max(inference_lab_max_waiting)",
        }
        seen: dict[str, float | None] = {}

        def saturated() -> bool:
            return ((seen.get("peak_waiting") or 0) >= MAX_WAITING
                    and (seen.get("rejections") or 0) > 0
                    and (seen.get("gateway_529") or 0) > 0
                    and seen.get("max_num_seqs") == 1)

        async def visible() -> bool:  # Prometheus's view: another process, no event
            for key, expr in queries.items():
                seen[key] = await _query_value(session, prometheus, expr)
            crashed = [t for t in clients if t.done() and t.exception() is not None]
            if crashed:
                raise crashed[0].exception()
            return saturated()

        started = time.monotonic()
        clients = [asyncio.create_task(client(session)) for _ in range(CLIENTS)]
        try:
            with contextlib.suppress(AssertionError):  # asserted below, with what it showed
                await until(visible, timeout=LOAD_TIMEOUT_S, interval=POLL_S, what="saturation")
            elapsed = time.monotonic() - started
        finally:
            stop.set()
            for task in clients:
                task.cancel()
            await asyncio.wait_for(asyncio.gather(*clients, return_exceptions=True), 15)
            async with session.post(f"{gateway}/control/capacity",
                                    json={"max_num_seqs": 256, "max_waiting": MAX_WAITING}) as resp:
                assert resp.status == 200

    print(f"saturation visible in Prometheus after {elapsed:.1f} s: {seen}; statuses {statuses}")
    assert saturated(), f"after {elapsed:.1f} s Prometheus shows {seen}; client statuses {statuses}"
    assert seen["peak_waiting"] == MAX_WAITING  # the queue never grows past max_waiting
    assert seen["max_waiting"] == MAX_WAITING
    assert refusals, f"no 529 reached the clients: {statuses}"
    content_type, error = refusals[0]
    assert content_type == "application/json"
    assert error["error"]["code"] == "queue_saturated"
    assert error["error"]["type"] == "overloaded_error"


@needs_compose
def test_docker_compose_runs_several_replicas_and_prometheus_discovers_each():
    run = compose_config(env=dict(COMPOSE_ENV, REPLICAS="4", GATEWAY_PORTS="8080-8083"))
    assert run.returncode == 0, run.stderr
    services = load_yaml(run.stdout)["services"]
    engine = services["engine"]["command"]
    assert engine[engine.index("--replicas") + 1] == "4"
    assert published(services["gateway"]) == {("127.0.0.1", p) for p in (8080, 8081, 8082, 8083)}
    jobs = {job["job_name"]: job for job in load_yaml(PROMETHEUS_YML.read_text())["scrape_configs"]}
    assert jobs["replicas"]["http_sd_configs"] == [
        {"url": "http://gateway:8080/fleet/targets", "refresh_interval": "5s"}]
