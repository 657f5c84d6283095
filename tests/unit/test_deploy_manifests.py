"""What the linters cannot see: the deployment files agree with each other and with the models.

scripts/lint_deploy.sh checks each file against its schema (test_deploy_lint.py runs it); these
tests check the references between them: labels and selectors, port names, probes, volumes and the
paths model.json expects, the metric names the autoscaler uses, the user id the image runs as.
"""

import json
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
MODELS = ("whisper_lora", "qwen_vl_lora")


def documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def resource(kind: str) -> dict:
    found = [doc for path in sorted(K8S.glob("*.yaml")) for doc in documents(path)]
    matches = [doc for doc in found if doc.get("kind") == kind]
    assert len(matches) == 1, f"expected one {kind} in k8s/, found {len(matches)}"
    return matches[0]


@pytest.fixture(scope="module")
def deployment() -> dict:
    return resource("Deployment")


def containers(deployment) -> dict[str, dict]:
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


@pytest.fixture(scope="module")
def container(deployment) -> dict:
    return containers(deployment)["triton"]


def model_json(model: str) -> dict:
    return json.loads((REPO / "model_repository_gpu" / model / "1" / "model.json").read_text())


def test_every_manifest_is_validated_or_cross_checked():
    """A new manifest must join lint_deploy.sh's schema check (or be one checked here)."""
    script = (REPO / "scripts" / "lint_deploy.sh").read_text()
    validated = set(re.search(r"^MANIFESTS=\(([^)]*)\)$", script, flags=re.M).group(1).split())
    custom = re.search(r"^CUSTOM_RESOURCES=\(([^)]*)\)$", script, flags=re.M).group(1).split()
    validated |= {pair.split("=")[0] for pair in custom}
    assert all((REPO / pair.split("=")[1]).is_file() for pair in custom)
    cross_checked_here = {  # no schema: checked here
        "k8s/servicemonitor.yaml",
        "k8s/kustomization.yaml",
        "k8s/inference-gateway/kustomization.yaml",
    }
    present = {
        str(path.relative_to(REPO))
        for path in [*K8S.glob("*.yaml"), *(K8S / "inference-gateway").glob("*.yaml")]
    }
    assert present == validated | cross_checked_here


def test_kustomization_lists_every_manifest():
    kustomization = documents(K8S / "kustomization.yaml")[0]
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    (image,) = kustomization["images"]
    for name, each in containers(resource("Deployment")).items():
        assert image["name"] == each["image"].rsplit(":", 1)[0], name


def test_selectors_match_the_pods(deployment):
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    service = resource("Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    monitored = resource("ServiceMonitor")["spec"]["selector"]["matchLabels"]
    assert monitored.items() <= service["metadata"]["labels"].items()
    spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"][0]
    assert spread["labelSelector"]["matchLabels"].items() <= pod_labels.items()


def test_ports_are_tritons_and_named_consistently(container, deployment):
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    (openai_port,) = containers(deployment)["openai"]["ports"]
    ports[openai_port["name"]] = openai_port["containerPort"]
    service = resource("Service")
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        name: (number, name) for name, number in ports.items()
    }
    (endpoint,) = resource("ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    annotations = resource("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(ports["metrics"])


def test_probes_use_tritons_health_endpoints(container):
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    startup = container["startupProbe"]
    # Liveness waits for the start-up probe: models load before Triton listens (minutes).
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 15 * 60


def test_one_gpu_per_replica(container):
    resources = container["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == 1


def test_runs_as_the_images_user(deployment):
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    uid = int(re.search(r"^ARG APP_UID=(\d+)$", dockerfile, flags=re.M).group(1))
    security = deployment["spec"]["template"]["spec"]["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == security["runAsGroup"] == security["fsGroup"] == uid


def mounts(container, deployment) -> dict[str, dict]:
    """mountPath -> the pod volume mounted there."""
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    return {m["mountPath"]: volumes[m["name"]] | {"mount": m} for m in container["volumeMounts"]}


def mounted_under(path: str, by_mount: dict[str, dict]) -> dict | None:
    best = None
    for mount_path, volume in by_mount.items():
        if path == mount_path or path.startswith(mount_path.rstrip("/") + "/"):
            if best is None or len(mount_path) > len(best[0]):
                best = (mount_path, volume)
    return best[1] if best else None


@pytest.mark.parametrize("model", MODELS)
def test_model_json_paths_are_on_the_right_volumes(model, container, deployment):
    by_mount = mounts(container, deployment)
    claims = {
        doc["metadata"]["name"]: doc
        for doc in documents(K8S / "pvc.yaml")
        if doc["kind"] == "PersistentVolumeClaim"
    }
    config = model_json(model)
    weights = mounted_under(config["model"], by_mount)
    assert weights and weights["persistentVolumeClaim"]["claimName"] in claims
    assert weights["mount"]["readOnly"] is True
    for root in config["serving"]["adapters"]["roots"]:
        volume = mounted_under(root, by_mount)
        assert volume, f"adapter root {root} is not on a mounted volume"
        claim = claims[volume["persistentVolumeClaim"]["claimName"]]
        # Every replica mounts the same adapters: a volume many nodes can mount at once.
        assert "ReadWriteMany" in claim["spec"]["accessModes"]
    snapshots = mounted_under(config["serving"]["adapters"]["snapshot_dir"], by_mount)
    assert snapshots and "emptyDir" in snapshots


def test_shared_memory_is_not_dockers_default(container, deployment):
    shm = mounts(container, deployment)["/dev/shm"]
    assert shm["emptyDir"]["medium"] == "Memory"


@pytest.mark.parametrize("model", MODELS)
def test_compose_mounts_what_model_json_expects(model):
    compose = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())
    service = compose["services"]["triton"]
    targets = {volume["target"]: volume for volume in service["volumes"]}
    config = model_json(model)
    assert mounted_under(config["model"], targets)["read_only"] is True
    for root in config["serving"]["adapters"]["roots"]:
        assert mounted_under(root, targets), root
    assert sorted(service["ports"]) == ["8000:8000", "8001:8001", "8002:8002"]
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]


def test_autoscaler_metrics_come_from_the_adapter_rules():
    hpa = resource("HorizontalPodAutoscaler")
    deployment = resource("Deployment")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert hpa["spec"]["minReplicas"] <= deployment["spec"]["replicas"]
    values = yaml.safe_load((K8S / "prometheus-adapter" / "values.yaml").read_text())
    rules = {rule["name"]["as"]: rule for rule in values["rules"]["custom"]}
    used = {metric["pods"]["metric"]["name"] for metric in hpa["spec"]["metrics"]}
    assert used == set(rules)
    for rule in rules.values():
        series = re.match(r"^(\w+)\{", rule["seriesQuery"]).group(1)
        assert rule["name"]["matches"] == f"^{series}$"
        assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}


def test_autoscaler_series_exist():
    """Each series the rules read is one Triton or our models export."""
    values = yaml.safe_load((K8S / "prometheus-adapter" / "values.yaml").read_text())
    series = {re.match(r"^(\w+)\{", r["seriesQuery"]).group(1) for r in values["rules"]["custom"]}
    ours = (REPO / "src" / "lora_serving" / "triton" / "metrics.py").read_text()
    for name in series:
        assert name.startswith("nv_inference_") or f'"{name}"' in ours, name


# ---- many replicas: InferencePool, endpoint picker, HTTPRoute (k8s/inference-gateway/) ---------
GATEWAY = K8S / "inference-gateway"


def gateway_resource(kind: str) -> dict:
    found = [doc for path in sorted(GATEWAY.glob("*.yaml")) for doc in documents(path)]
    (match,) = [doc for doc in found if doc.get("kind") == kind]
    return match


def epp_config() -> dict:
    return yaml.safe_load(gateway_resource("ConfigMap")["data"]["epp-config.yaml"])


def flags(container: dict) -> dict[str, str]:
    items = container.get("command", [])[1:] + container.get("args", [])
    return dict(item.removeprefix("--").split("=", 1) for item in items)


def test_gateway_kustomization_adds_its_files_to_the_base():
    kustomization = documents(GATEWAY / "kustomization.yaml")[0]
    assert kustomization["resources"][0] == "../"
    assert set(kustomization["resources"][1:]) == {
        p.name for p in GATEWAY.glob("*.yaml") if p.name != "kustomization.yaml"
    }
    base = documents(K8S / "kustomization.yaml")[0]
    assert kustomization["namespace"] == base["namespace"]
    (binding,) = gateway_resource("RoleBinding")["subjects"]
    assert binding["namespace"] == base["namespace"]
    (image,) = kustomization["images"]
    (epp,) = gateway_resource("Deployment")["spec"]["template"]["spec"]["containers"]
    assert epp["image"] == f"{image['name']}:{image['newTag']}"


def test_the_pool_routes_to_the_openai_front_of_the_server_pods(deployment):
    pool = gateway_resource("InferencePool")["spec"]
    server_pods = deployment["spec"]["template"]["metadata"]["labels"]
    picker_pods = gateway_resource("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pool["selector"]["matchLabels"].items() <= server_pods.items()
    assert not pool["selector"]["matchLabels"].items() <= picker_pods.items()
    front = containers(deployment)["openai"]
    (front_port,) = front["ports"]
    assert [p["number"] for p in pool["targetPorts"]] == [front_port["containerPort"]]
    # The front talks to its own pod's Triton, and reads Triton's metrics for /metrics.
    triton = {p["name"]: p["containerPort"] for p in containers(deployment)["triton"]["ports"]}
    options = flags(front)
    assert options["port"] == str(front_port["containerPort"]) and options["host"] == "0.0.0.0"
    assert options["triton-url"] == f"127.0.0.1:{triton['grpc']}"
    assert options["triton-metrics-url"] == f"http://127.0.0.1:{triton['metrics']}/metrics"
    assert front["readinessProbe"]["httpGet"]["path"] == "/health"


def test_the_pool_the_picker_and_the_route_name_each_other():
    pool = gateway_resource("InferencePool")
    picker = gateway_resource("Deployment")["spec"]["template"]["spec"]
    service = gateway_resource("Service")
    ref = pool["spec"]["endpointPickerRef"]
    assert ref["name"] == service["metadata"]["name"]
    ext_proc = {p["port"]: p for p in service["spec"]["ports"]}[ref["port"]["number"]]
    (epp,) = picker["containers"]
    ports = {p["name"]: p["containerPort"] for p in epp["ports"]}
    assert ports[ext_proc["targetPort"]] == ref["port"]["number"]
    assert ext_proc["appProtocol"] == "kubernetes.io/h2c"
    options = flags(epp)
    assert options["pool-name"] == pool["metadata"]["name"]
    assert options["pool-group"] == pool["apiVersion"].split("/")[0]
    assert int(options["grpc-port"]) == ports["grpc"]
    assert epp["readinessProbe"]["grpc"]["port"] == int(options["grpc-health-port"])
    mount = {m["name"]: m["mountPath"] for m in epp["volumeMounts"]}["config"]
    (volume,) = picker["volumes"]
    configmap = gateway_resource("ConfigMap")
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    assert options["config-file"].removeprefix(mount + "/") in configmap["data"]
    assert picker["serviceAccountName"] == gateway_resource("ServiceAccount")["metadata"]["name"]
    role = gateway_resource("RoleBinding")
    assert role["subjects"][0]["name"] == picker["serviceAccountName"]
    assert role["roleRef"]["name"] == gateway_resource("Role")["metadata"]["name"]
    (rule,) = gateway_resource("HTTPRoute")["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        pool["apiVersion"].split("/")[0],
        "InferencePool",
        pool["metadata"]["name"],
    )


def test_the_picker_reads_what_the_front_publishes_and_scores_lora_affinity(deployment):
    from lora_openai import picker_metrics
    from lora_tools.bench.picker import WEIGHTS

    config = epp_config()
    assert (config["apiVersion"], config["kind"]) == ("llm-d.ai/v1alpha1", "EndpointPickerConfig")
    plugins = {p.get("name", p["type"]): p for p in config["plugins"]}
    (extractor,) = [p for p in config["plugins"] if p["type"] == "core-metrics-extractor"]
    params = extractor["parameters"]
    (engine,) = params["engineConfigs"]
    # Our pods carry the engine label, and unlabelled ones fall back to the same mapping.
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pod_labels[params["engineLabelKey"]] == engine["name"] == params["defaultEngine"]
    assert engine == {
        "name": engine["name"],
        "queuedRequestsSpec": picker_metrics.WAITING,
        "runningRequestsSpec": picker_metrics.RUNNING,
        "kvUsageSpec": picker_metrics.KV_USAGE,
        "loraSpec": picker_metrics.LORA_INFO,
    }
    (source,) = [p for p in config["plugins"] if p["type"] == "metrics-data-source"]
    assert source["parameters"]["path"] == "/metrics"
    (profile,) = config["schedulingProfiles"]
    refs = [p["pluginRef"] for p in profile["plugins"]]
    assert all(ref in plugins for ref in refs)
    scorers = {p["pluginRef"]: p["weight"] for p in profile["plugins"] if "weight" in p}
    assert scorers == WEIGHTS  # the weights the routing study routes with
    assert plugins[refs[-1]]["type"] == "max-score-picker"
    parsers = [p["pluginRef"] for p in config["requestHandler"]["parsers"]]
    assert [plugins[p]["type"] for p in parsers] == ["openai-parser", "passthrough-parser"]
    (layer,) = config["dataLayer"]["sources"]
    assert plugins[layer["pluginRef"]]["type"] == "metrics-data-source"
    assert [plugins[e["pluginRef"]]["type"] for e in layer["extractors"]] == [
        "core-metrics-extractor"
    ]
