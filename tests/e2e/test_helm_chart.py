"""The Helm chart deploy/helm/inference-lab, rendered offline with Helm 4 as a library
(PyPI helm-python-sdk: no helm binary, no cluster) for the default values and each optional
feature, every object validated against the Kubernetes schemas (PyPI kubernetes-validate,
offline). Custom resources have no schema offline (kubernetes-validate ships the core API
only): they are listed as unchecked and their shape is asserted here instead."""

from __future__ import annotations

from pathlib import Path

import pytest

helm = pytest.importorskip("helm_python")
kubernetes_validate = pytest.importorskip("kubernetes_validate")
yaml = pytest.importorskip("yaml")

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "inference-lab"
KUBERNETES = "1.33"
# Custom resources: no schema offline, so not validated by kubernetes-validate.
UNCHECKED = {"ServiceMonitor", "ScaledObject", "InferencePool"}
SELECTOR = {"app.kubernetes.io/name": "inference-lab", "app.kubernetes.io/instance": "lab"}


def render(values: dict | None = None) -> dict[str, dict]:
    """Every rendered object by kind (one of each here), each checked against its schema."""
    manifests = helm.Chart.load(CHART).render(values or {}, name="lab", namespace="lab-ns")
    objects = {}
    for text in manifests.values():
        for doc in yaml.safe_load_all(text):
            if not doc:
                continue
            if doc["kind"] in UNCHECKED:
                with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                    kubernetes_validate.validate(doc, KUBERNETES, strict=True)
            else:
                kubernetes_validate.validate(doc, KUBERNETES, strict=True)  # raises if invalid
            assert doc["kind"] not in objects
            objects[doc["kind"]] = doc
    return objects


def test_the_chart_lints_clean():
    report = helm.lint(str(CHART))
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_default_values_render_a_deployment_of_engine_and_gateway_pods_behind_a_service():
    objects = render()
    assert set(objects) == {"ConfigMap", "Deployment", "Service", "NetworkPolicy"}
    deployment = objects["Deployment"]
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["labels"] == SELECTOR
    engine, gateway = pod["spec"]["containers"]
    assert engine["name"] == "engine" and gateway["name"] == "gateway"
    assert engine["args"][:1] == ["engine"] and "--startup-delay" in engine["args"]
    assert engine["args"][engine["args"].index("--host") + 1] == "127.0.0.1"  # localhost gRPC
    assert gateway["args"][gateway["args"].index("--engine") + 1] == "127.0.0.1:50051"
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/health"
    assert gateway["startupProbe"]["httpGet"]["path"] == "/health"
    assert "gpt-oss-20b.toml" in objects["ConfigMap"]["data"]
    service = objects["Service"]
    assert service["spec"]["selector"] == SELECTOR
    assert service["spec"]["ports"][0]["targetPort"] == "http"


SECRET_ENV = ("INFERENCE_LAB_API_KEY", "INFERENCE_LAB_CONTROL_TOKEN")


def containers(objects: dict) -> dict[str, dict]:
    return {c["name"]: c for c in objects["Deployment"]["spec"]["template"]["spec"]["containers"]}


@pytest.mark.parametrize("values", [{"auth": {"existingSecret": "lab-secrets"}},
                                    {"auth": {"apiKey": "sk-x", "controlToken": "ct-y"}}])
def test_both_containers_take_both_secrets_from_a_kubernetes_secret(values):
    objects = render(values)
    name = values["auth"].get("existingSecret") or "lab-inference-lab-secrets"
    for container in containers(objects).values():
        env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
        assert env == {"INFERENCE_LAB_API_KEY": {"name": name, "key": "api-key", "optional": True},
                       "INFERENCE_LAB_CONTROL_TOKEN": {"name": name, "key": "control-token",
                                                       "optional": True}}
        assert "sk-x" not in str(container) and "ct-y" not in str(container)  # never inline
    if "existingSecret" in values["auth"]:
        assert "Secret" not in objects  # yours, not the chart's
    else:
        assert objects["Secret"]["stringData"] == {"api-key": "sk-x", "control-token": "ct-y"}
    assert all("env" not in c for c in containers(render()).values())  # none: open, no env


def test_pods_run_non_root_on_a_read_only_root_without_capabilities():
    objects = render()
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # the image's user
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in containers(objects).values():
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]}}
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]


def test_the_network_policy_admits_the_gateway_port_alone():
    objects = render()
    policy = objects["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"] == SELECTOR
    assert policy["policyTypes"] == ["Ingress"]
    assert policy["ingress"] == [{"ports": [{"port": "http", "protocol": "TCP"}]}]
    ports = {p["name"]: p["containerPort"] for c in containers(objects).values()
             for p in c.get("ports", [])}
    assert ports["http"] == 8080  # the engine's 50051 and 50052 are not admitted
    peers = [{"namespaceSelector": {"matchLabels": {"team": "lab"}}}]
    narrowed = render({"networkPolicy": {"from": peers}})["NetworkPolicy"]["spec"]
    assert narrowed["ingress"][0]["from"] == peers
    assert "NetworkPolicy" not in render({"networkPolicy": {"enabled": False}})


def test_the_engine_has_startup_and_liveness_probes_of_its_grpc_health():
    engine = containers(render())["engine"]
    for probe in ("startupProbe", "livenessProbe"):
        command = engine[probe]["exec"]["command"]
        assert command[:2] == ["python", "-c"]
        assert "127.0.0.1:50051" in command[2] and "HealthStub" in command[2]
        assert engine[probe]["timeoutSeconds"] == 5


def test_the_engine_probe_command_runs_against_a_real_engine():
    """The probe's Python, run as the kubelet would: exit 0 against a live engine,
    non-zero once it is gone."""
    import subprocess
    import sys

    from inference_lab.testing.launch import engine_process

    command = containers(render())["engine"]["startupProbe"]["exec"]["command"]
    with engine_process() as engine:
        code = command[2].replace("127.0.0.1:50051", f"127.0.0.1:{engine.port}")
        assert subprocess.run([sys.executable, "-c", code], timeout=30).returncode == 0
    assert subprocess.run([sys.executable, "-c", code], capture_output=True,
                          timeout=30).returncode != 0


def test_model_config_and_hardware_come_from_values():
    objects = render({"hardware": "h200", "modelConfigs": {
        "gpt-oss-20b.toml": None, "llama.toml": 'model = "llama-3.1-8b"\n'}})
    engine = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert engine["args"][engine["args"].index("--hardware") + 1] == "h200"
    assert objects["ConfigMap"]["data"] == {"llama.toml": 'model = "llama-3.1-8b"\n'}
    baked = render({"modelConfigs": None})  # the configs baked into the image
    assert "ConfigMap" not in baked
    assert [v["name"] for v in baked["Deployment"]["spec"]["template"]["spec"]["volumes"]] == ["tmp"]


def test_service_monitor_scrapes_every_pod_metrics():
    monitor = render({"serviceMonitor": {"enabled": True}})["ServiceMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"] == SELECTOR
    assert monitor["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "5s"}]


def test_hpa_scales_the_deployment_on_the_waiting_queue():
    objects = render({"autoscaling": {"hpa": {"enabled": True}}})
    hpa = objects["HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == objects["Deployment"]["metadata"]["name"]
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "vllm:num_requests_waiting"
    assert "replicas" not in objects["Deployment"]["spec"]  # the autoscaler owns the count


def test_keda_scaled_object_queries_prometheus_for_the_waiting_queue():
    objects = render({"autoscaling": {"keda": {"enabled": True}}})
    scaled = objects["ScaledObject"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus"
    assert trigger["metadata"]["query"] == 'sum(vllm:num_requests_waiting{namespace="lab-ns"})'
    assert scaled["spec"]["scaleTargetRef"]["name"] == objects["Deployment"]["metadata"]["name"]


def test_inference_pool_selects_the_pods_and_names_its_endpoint_picker():
    pool = render({"inferencePool": {"enabled": True}})["InferencePool"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"]["selector"]["matchLabels"] == SELECTOR
    assert pool["spec"]["targetPorts"] == [{"number": 8080}]
    assert pool["spec"]["endpointPickerRef"]["name"] == "inference-lab-epp"


def test_bad_values_fail_to_validate():
    objects = helm.Chart.load(CHART).render({"replicaCount": "two"}, name="lab")
    deployment = next(yaml.safe_load(t) for t in objects.values() if "kind: Deployment" in t)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)


EXAMPLES = CHART.parent / "examples"


def test_the_hpa_example_renders_a_valid_hpa_with_kubernetes_default_behaviour():
    objects = render(yaml.safe_load((EXAMPLES / "autoscaling-hpa.yaml").read_text()))
    spec = objects["HorizontalPodAutoscaler"]["spec"]  # validated against autoscaling/v2
    assert (spec["minReplicas"], spec["maxReplicas"]) == (1, 16)
    assert spec["metrics"][0]["pods"]["metric"]["name"] == "vllm:num_requests_running"
    assert spec["metrics"][0]["pods"]["target"] == {"type": "AverageValue", "averageValue": "32"}
    # the behaviour written out is the one the lab's hpa autoscaler defaults to
    from inference_lab.autoscale.hpa import SCALE_DOWN, SCALE_UP, behavior
    assert behavior(spec["behavior"]["scaleUp"], SCALE_DOWN, "up") == SCALE_UP
    assert behavior(spec["behavior"]["scaleDown"], SCALE_UP, "down") == SCALE_DOWN


def test_the_keda_example_renders_its_polling_cooldown_and_activation():
    objects = render(yaml.safe_load((EXAMPLES / "autoscaling-keda.yaml").read_text()))
    spec = objects["ScaledObject"]["spec"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 16)
    assert (spec["pollingInterval"], spec["cooldownPeriod"]) == (30, 300)
    trigger = spec["triggers"][0]
    assert trigger["metadata"] == {
        "serverAddress": "http://prometheus-operated.monitoring.svc:9090",
        "query": 'sum(vllm:num_requests_running{namespace="lab-ns"})',
        "threshold": "32", "activationThreshold": "0"}
    assert "advanced" not in spec  # no behaviour given: the HPA's defaults
    # the query is one the lab's keda autoscaler reads (its namespace label aside)
    from inference_lab.autoscale.metrics import parse_query
    assert parse_query("sum(vllm:num_requests_running)").name == "vllm:num_requests_running"


def test_a_scale_down_behaviour_reaches_the_hpa_keda_creates():
    down = {"stabilizationWindowSeconds": 60, "policies": [{"type": "Pods", "value": 1, "periodSeconds": 30}]}
    spec = render({"autoscaling": {"keda": {"enabled": True, "behavior": {"scaleDown": down}}}})[
        "ScaledObject"]["spec"]
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == {"scaleDown": down}
    assert "pollingInterval" not in spec and "cooldownPeriod" not in spec  # KEDA's defaults


def test_pd_runs_both_pools_in_each_pod_behind_a_prefill_and_a_decode_service():
    manifests = helm.Chart.load(CHART).render(
        {"pd": {"enabled": True, "prefill": 1, "decode": 2, "link": "nvlink"}},
        name="lab", namespace="lab-ns")
    docs = [d for text in manifests.values() for d in yaml.safe_load_all(text) if d]
    for doc in docs:
        if doc["kind"] not in UNCHECKED:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    engine, gateway = deployment["spec"]["template"]["spec"]["containers"]
    args = engine["args"]
    assert args[args.index("--replicas") + 1] == "3"
    assert args[args.index("--kv-roles") + 1] == "1:2"
    assert args[args.index("--kv-link") + 1] == "nvlink"
    assert [(p["name"], p["containerPort"]) for p in gateway["ports"]] == [
        ("http", 8080), ("replica-1", 8081), ("replica-2", 8082)]
    prefill, decode = services["lab-inference-lab-prefill"], services["lab-inference-lab-decode"]
    assert [(p["port"], p["targetPort"]) for p in prefill["spec"]["ports"]] == [(8080, "http")]
    assert [(p["port"], p["targetPort"]) for p in decode["spec"]["ports"]] == [
        (8081, "replica-1"), (8082, "replica-2")]
    assert prefill["spec"]["selector"] == decode["spec"]["selector"] == SELECTOR
    [policy] = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert [p["port"] for p in policy["spec"]["ingress"][0]["ports"]] == [
        "http", "replica-1", "replica-2"]


ENGINE_PROBE = "g.HealthStub(grpc.insecure_channel('127.0.0.1:{}'))"


def arg(container: dict, flag: str) -> str:
    args = container["args"]
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("balancing", ["internal", "external"])
def test_data_parallel_ranks_and_api_servers_run_as_containers_of_one_pod(balancing):
    objects = render({"dataParallel": {"size": 2, "loadBalancing": balancing},
                      "apiServerCount": 2, "serviceMonitor": {"enabled": True},
                      "inferencePool": {"enabled": True}})
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["engine-0", "engine-1", "gateway-0",
                                                      "gateway-1"]
    by_name = containers(objects)
    for rank in (0, 1):
        engine = by_name[f"engine-{rank}"]
        assert engine["args"][:1] == ["engine"]
        assert arg(engine, "--data-parallel-size") == "2"
        assert arg(engine, "--data-parallel-rank") == str(rank)
        assert arg(engine, "--host") == "127.0.0.1"
        assert arg(engine, "--port") == str(50051 + 10 * rank)  # each rank its own ports
        assert arg(engine, "--metrics-port") == str(50052 + 10 * rank)
        assert engine["ports"] == [{"name": f"metrics-{rank}", "containerPort": 50052 + 10 * rank}]
        for probe in ("startupProbe", "livenessProbe"):  # each rank's own gRPC health
            assert ENGINE_PROBE.format(50051 + 10 * rank) in engine[probe]["exec"]["command"][2]
        assert engine["resources"]["requests"]["cpu"] == "1"  # per container
    for index in (0, 1):
        gateway = by_name[f"gateway-{index}"]
        assert gateway["args"][:1] == ["gateway"]
        assert arg(gateway, "--engine") == "127.0.0.1:50051,127.0.0.1:50061"  # rank order
        assert arg(gateway, "--data-parallel") == balancing
        assert arg(gateway, "--api-server-index") == str(index)
        assert arg(gateway, "--api-server-count") == "2"
        assert arg(gateway, "--port") == "8080"  # shared (SO_REUSEPORT)
        port = "http" if index == 0 else 8080  # the first declares the shared ports
        assert gateway["readinessProbe"]["httpGet"] == {"path": "/health/ready", "port": port}
        assert gateway["livenessProbe"]["httpGet"] == {"path": "/health", "port": port}
        assert gateway["startupProbe"]["httpGet"] == {"path": "/health", "port": port}
        assert gateway["resources"]["requests"]["cpu"] == "1"
    for container in pod["containers"]:
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert "ports" not in by_name["gateway-1"]
    ranks = [("http", 8080)] + ([("rank-1", 8081)] if balancing == "external" else [])
    assert [(p["name"], p["containerPort"]) for p in by_name["gateway-0"]["ports"]] == ranks
    service = objects["Service"]["spec"]["ports"]
    assert [(p["name"], p["port"], p["targetPort"]) for p in service] == [
        (name, port, name) for name, port in ranks]
    policy = objects["NetworkPolicy"]["spec"]["ingress"]
    assert policy == [{"ports": [{"port": name, "protocol": "TCP"} for name, _ in ranks]}]
    # the gateway's /metrics carries every rank's series; with external balancing each
    # rank's port carries that rank's, so each is scraped
    endpoints = objects["ServiceMonitor"]["spec"]["endpoints"]
    assert endpoints == [{"port": name, "path": "/metrics", "interval": "5s"}
                         for name, _ in ranks]
    assert objects["InferencePool"]["spec"]["targetPorts"] == [
        {"number": port} for _, port in ranks]


def test_api_servers_without_ranks_share_the_one_engine():
    by_name = containers(render({"apiServerCount": 3}))
    assert list(by_name) == ["engine", "gateway-0", "gateway-1", "gateway-2"]
    assert "--data-parallel-size" not in by_name["engine"]["args"]
    for index in range(3):
        gateway = by_name[f"gateway-{index}"]
        assert arg(gateway, "--engine") == "127.0.0.1:50051"
        assert "--data-parallel" not in gateway["args"]
        assert (arg(gateway, "--api-server-index"), arg(gateway, "--api-server-count")) == (
            str(index), "3")


def test_ranks_behind_one_api_server_keep_the_gateway_name():
    by_name = containers(render({"dataParallel": {"size": 3}}))
    assert list(by_name) == ["engine-0", "engine-1", "engine-2", "gateway"]
    gateway = by_name["gateway"]
    assert arg(gateway, "--engine") == "127.0.0.1:50051,127.0.0.1:50061,127.0.0.1:50071"
    assert arg(gateway, "--data-parallel") == "internal"
    assert "--api-server-index" not in gateway["args"]
    assert gateway["readinessProbe"]["httpGet"]["port"] == "http"


def test_one_rank_and_one_api_server_render_as_the_chart_without_them():
    chart = helm.Chart.load(CHART)
    for extra in ({}, {"serviceMonitor": {"enabled": True}, "inferencePool": {"enabled": True}},
                  {"pd": {"enabled": True, "prefill": 1, "decode": 2}}):
        plain = chart.render(extra, name="lab", namespace="lab-ns")
        ones = chart.render({**extra, "dataParallel": {"size": 1, "loadBalancing": "external"},
                             "apiServerCount": 1}, name="lab", namespace="lab-ns")
        assert ones == plain  # byte for byte
    by_name = containers(render())
    assert list(by_name) == ["engine", "gateway"]
    assert "--data-parallel-size" not in by_name["engine"]["args"]
    assert not {"--data-parallel", "--api-server-count"} & set(by_name["gateway"]["args"])


@pytest.mark.parametrize(("values", "message"), [
    ({"pd": {"enabled": True}, "dataParallel": {"size": 2}},
     "pd.enabled with dataParallel.size 2: choose one"),
    ({"dataParallel": {"size": 2, "loadBalancing": "hybrid"}},
     "dataParallel.loadBalancing must be internal or external, got hybrid"),
    ({"dataParallel": {"size": 0}}, "dataParallel.size must be an integer in 1..64"),
    ({"apiServerCount": 0}, "apiServerCount must be an integer in 1..64"),
    ({"dataParallel": {"size": 2}, "ports": {"grpc": 50051, "engineMetrics": 50061}},
     "ports.grpc 50051 and ports.engineMetrics 50061"),
    ({"dataParallel": {"size": 9, "loadBalancing": "external"},
      "inferencePool": {"enabled": True}}, "at most 8 target ports"),
    ({"kvOffloading": {"size": -1}}, "kvOffloading.size must be a number of GiB > 0"),
    ({"kvOffloading": {"size": "lots"}}, "kvOffloading.size must be a number of GiB > 0"),
    ({"kvOffloading": {"size": 8, "backend": "mooncake"}},
     "kvOffloading.backend must be native or lmcache, got mooncake"),
])
def test_contradicting_scale_out_values_fail_to_render_naming_them(values, message):
    with pytest.raises(helm.HelmError, match=message.replace(".", r"\.")):
        helm.Chart.load(CHART).render(values, name="lab", namespace="lab-ns")


@pytest.mark.parametrize("values, backend", [({"size": 256}, "native"),
                                             ({"size": 1.5, "backend": "lmcache"}, "lmcache")])
def test_kv_offloading_reaches_every_engine_as_vllms_flags(values, backend):
    for size in (1, 2):  # one engine, and one per data-parallel rank
        by_name = containers(render({"kvOffloading": values, "dataParallel": {"size": size}}))
        engines = [c for name, c in by_name.items() if name.startswith("engine")]
        assert len(engines) == size
        for engine in engines:
            args = engine["args"]
            flag = args.index("--kv-offloading-size")
            assert args[flag + 1] == str(values["size"])
            assert args[args.index("--kv-offloading-backend") + 1] == backend
        assert not any("offloading" in a for a in by_name["gateway"]["args"])


def test_kv_offloading_off_by_default_adds_no_flag():
    for values in ({}, {"kvOffloading": {"size": None}}, {"kvOffloading": {"size": 0}}):
        engine = containers(render(values))["engine"]
        assert not any("offloading" in a for a in engine["args"])
