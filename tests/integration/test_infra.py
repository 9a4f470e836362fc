"""infra/: every Kubernetes manifest valid against the Kubernetes schemas in strict mode (unknown fields
rejected), the pieces consistent with each other and with the code, the Dockerfile linted as far as can be
without a Docker engine, the Grafana dashboard and the metrics reference (docs/reference/metrics.md) in step with
the gateway's metrics. (A real Prefect API taking the Kubernetes work pool's job template: ``test_deployments.py``.)"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_validate import utils as kv

PROJECT_DIR = Path(__file__).resolve().parents[2]
K8S = PROJECT_DIR / "infra" / "k8s"
REPLICA_TEMPLATE = K8S / "replica" / "template.yaml"  # not applied: the gateways' backend renders it per entity
JOB_TEMPLATE = PROJECT_DIR / "infra" / "prefect" / "kubernetes-base-job-template.json"
KUBERNETES_VERSION = "1.37.0"  # the newest schemas kubernetes-validate bundles (no network needed)


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def documents() -> list[dict[str, Any]]:
    return [doc for path in manifest_files() for doc in yaml.safe_load_all(path.read_text()) if doc]


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in documents() if d["kind"] == kind]


def named(kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for d in by_kind(kind) if d["metadata"]["name"] == name]
    return doc


def strict(doc: dict[str, Any]) -> None:
    kv.validate(doc, KUBERNETES_VERSION, strict=True)


def replica_objects() -> dict[str, dict[str, Any]]:
    """What the Kubernetes backend makes of the template for one served entity."""
    from serving.replicas.cluster.objects import ReplicaTemplate, Wanted, owned_by

    objects = ReplicaTemplate.load(REPLICA_TEMPLATE).render(Wanted("fraud", "champion", "models:/fraud/3"), 2)
    name = objects["Deployment"]["metadata"]["name"]
    return {kind: obj if kind == "Deployment" else owned_by(obj, name, "0b9c7f1e-uid") for kind, obj in objects.items()}


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.name)
def test_every_manifest_is_valid_kubernetes_in_strict_mode(path: Path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs
    for doc in docs:
        strict(doc)


def test_strict_mode_rejects_an_unknown_field():
    deployment = copy.deepcopy(named("Deployment", "tollfree-gateway"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}  # a typo of readinessProbe
    with pytest.raises(kv.ValidationError):
        strict(deployment)


def test_kustomization_lists_every_manifest_and_renders():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in manifest_files())
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the rendered kustomization is not checked")
    rendered = subprocess.run(
        [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    assert len(docs) == len(documents()) + 1  # and the replica template's ConfigMap
    [template] = [d for d in docs if d["metadata"]["name"].startswith("tollfree-replica-template")]
    assert template["data"]["template.yaml"] == REPLICA_TEMPLATE.read_text()
    [gateway] = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "tollfree-gateway"]
    [volume] = [v for v in gateway["spec"]["template"]["spec"]["volumes"] if v["name"] == "replica-template"]
    assert volume["configMap"]["name"] == template["metadata"]["name"]  # kustomize's hashed name, followed
    for doc in docs:
        strict(doc)
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "tollfree", doc["metadata"]["name"]


def test_the_gateways_may_only_manage_replica_deployments_and_watch_endpointslices_in_their_namespace():
    role = named("Role", "tollfree-gateway")
    assert role["rules"] == [
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["create", "get", "list", "delete"]},
        {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["services"], "verbs": ["create"]},
        {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["create"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
    ]
    assert not [d for d in documents() if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    binding = named("RoleBinding", "tollfree-gateway")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tollfree-gateway"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tollfree-gateway", "namespace": "tollfree"}]
    gateway = named("Deployment", "tollfree-gateway")
    assert gateway["spec"]["template"]["spec"]["serviceAccountName"] == "tollfree-gateway"


def test_two_gateways_behind_a_service_with_a_disruption_budget_select_the_kubernetes_backend():
    gateway = named("Deployment", "tollfree-gateway")
    assert gateway["spec"]["replicas"] >= 2
    assert named("PodDisruptionBudget", "tollfree-gateway")["spec"] == {
        "minAvailable": 1,
        "selector": {"matchLabels": gateway["spec"]["selector"]["matchLabels"]},
    }
    [container] = gateway["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["TOLLFREE_BACKEND"] == "kubernetes"
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "replica-template"]
    assert env["TOLLFREE_K8S_TEMPLATE"] == mount["mountPath"] + "/template.yaml"
    secrets = {s["secretRef"]["name"] for s in container["envFrom"] if "secretRef" in s}
    assert secrets == {"tollfree-admin-token", "tollfree-replica-token", "tollfree-state-url"}
    [replica] = replica_objects()["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert {"secretRef": {"name": "tollfree-replica-token"}} in replica["envFrom"]  # the same token as the gateways


def test_every_object_the_backend_renders_from_the_template_is_valid_in_strict_mode():
    for doc in [d for d in yaml.safe_load_all(REPLICA_TEMPLATE.read_text()) if d]:
        strict(doc)
    for obj in replica_objects().values():
        strict(obj)
    pod = replica_objects()["Deployment"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] in {d["metadata"]["name"] for d in by_kind("ServiceAccount")}


def test_role_bindings_and_pods_refer_to_accounts_and_roles_that_exist():
    accounts = {d["metadata"]["name"] for d in by_kind("ServiceAccount")}
    roles = {d["metadata"]["name"] for d in by_kind("Role")}
    for binding in by_kind("RoleBinding"):
        assert binding["roleRef"]["name"] in roles
        assert {s["name"] for s in binding["subjects"]} <= accounts
    for workload in by_kind("Deployment") + by_kind("Job"):
        assert workload["spec"]["template"]["spec"].get("serviceAccountName", "default") in accounts
    template = json.loads(JOB_TEMPLATE.read_text())
    assert template["variables"]["properties"]["service_account_name"]["default"] in accounts


def _probe_paths(container: dict[str, Any]) -> dict[str, str]:
    return {
        kind: container[kind]["httpGet"]["path"]
        for kind in ("startupProbe", "readinessProbe", "livenessProbe")
        if kind in container
    }


def test_model_replicas_update_without_downtime_and_probe_routes_the_replica_serves():
    replica = replica_objects()["Deployment"]
    rolling = replica["spec"]["strategy"]["rollingUpdate"]
    assert replica["spec"]["strategy"]["type"] == "RollingUpdate"
    assert rolling["maxUnavailable"] == 0 and rolling["maxSurge"] >= 1
    [container] = replica["spec"]["template"]["spec"]["containers"]
    probes = _probe_paths(container)
    assert {"readinessProbe", "livenessProbe"} <= set(probes)
    for kind in probes:  # explicit, never Kubernetes' 1 s default: a probe must outlast a busy event loop's turn
        assert container[kind]["timeoutSeconds"] >= 2 and container[kind]["periodSeconds"] > 0, kind
    served = "".join(p.read_text() for p in (PROJECT_DIR / "serving" / "replica_server").glob("*.py"))
    for path in probes.values():
        assert f'"{path}"' in served, f"the replica serves no {path}"
    assert container["command"][:3] == ["python", "-m", "serving.replica_server"]
    gateway_container = named("Deployment", "tollfree-gateway")["spec"]["template"]["spec"]["containers"][0]
    gateway_source = (PROJECT_DIR / "serving" / "gateway" / "app.py").read_text()
    for path in _probe_paths(gateway_container).values():
        assert f'"{path}"' in gateway_source, f"the gateway serves no {path}"


def test_services_and_the_disruption_budget_select_the_pods_they_mean():
    pods = {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"] for d in by_kind("Deployment")}

    def selected(selector: dict[str, str]) -> set[str]:
        return {name for name, labels in pods.items() if selector.items() <= labels.items()}

    assert selected(named("Service", "tollfree-gateway")["spec"]["selector"]) == {"tollfree-gateway"}
    replica = replica_objects()
    name = replica["Deployment"]["metadata"]["name"]
    pods[name] = replica["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert selected(replica["Service"]["spec"]["selector"]) == {name}
    assert selected(replica["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"]) == {name}
    assert replica["PodDisruptionBudget"]["spec"]["minAvailable"] == 1
    for deployment in by_kind("Deployment"):
        assert (
            deployment["spec"]["selector"]["matchLabels"].items()
            <= deployment["spec"]["template"]["metadata"]["labels"].items()
        )


def test_containers_run_modules_that_exist_and_read_config_that_is_defined():
    configmaps = {d["metadata"]["name"] for d in by_kind("ConfigMap")}
    for workload in by_kind("Deployment") + by_kind("Job") + [replica_objects()["Deployment"]]:
        for container in workload["spec"]["template"]["spec"]["containers"]:
            command = container["command"]
            if command[:2] == ["python", "-m"]:
                module = PROJECT_DIR / Path(*command[2].split("."))
                assert module.with_suffix(".py").exists() or (module / "__main__.py").exists(), command[2]
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in configmaps
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
        assert workload["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    register = named("Job", "tollfree-register-deployments")["spec"]["template"]["spec"]["containers"][0]["command"]
    template_path = register[register.index("--base-job-template") + 1]
    assert template_path == "/app/" + str(JOB_TEMPLATE.relative_to(PROJECT_DIR))


def _render_job(template: dict[str, Any]) -> dict[str, Any]:
    """The Job the Kubernetes worker would submit with the pool's default variables (Prefect's own templating)."""
    from prefect.utilities.templating import apply_values

    values = {name: spec["default"] for name, spec in template["variables"]["properties"].items() if "default" in spec}
    values.update(
        name="tollfree-flow-run",
        command="prefect flow-run execute",
        env={"PREFECT__FLOW_RUN_ID": "x"},
        labels={"prefect.io/flow-run-id": "x"},
    )
    job = apply_values(template["job_configuration"]["job_manifest"], values)
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": k, "value": v} for k, v in container["env"].items()]  # as the worker does
    container["args"] = container["args"].split()
    return job


def test_the_kubernetes_job_template_renders_a_strictly_valid_job_in_the_namespace():
    template = json.loads(JOB_TEMPLATE.read_text())
    job = _render_job(template)
    strict(job)
    assert job["metadata"]["namespace"] == "tollfree"
    assert (
        job["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
        == named("PersistentVolumeClaim", "tollfree-state")["metadata"]["name"]
    )


# ---- Dockerfile ---------------------------------------------------------------------------------

DOCKERFILE = PROJECT_DIR / "infra" / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def test_dockerfile_copies_only_what_exists_and_the_dockerignore_lets_through():
    ignore = (PROJECT_DIR / "infra" / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    copies = [args.split() for op, args in _instructions() if op == "COPY"]
    assert copies
    for args in copies:
        if any(a.startswith("--from") for a in args):
            continue
        for source in args[:-1]:
            assert (PROJECT_DIR / source).exists(), f"COPY {source}: no such file in the build context"
            assert source.rstrip("/") in allowed, f"COPY {source}: excluded by Dockerfile.dockerignore"
    # the project installs from the committed lock, without the dev group
    runs = " ".join(args for op, args in _instructions() if op == "RUN")
    assert "uv sync --frozen --no-dev" in runs


def test_dockerfile_stages_are_the_ones_the_manifests_use_and_run_as_non_root():
    instructions = _instructions()
    stages = [args.split()[-1] for op, args in instructions if op == "FROM"]
    assert stages == ["runtime", "worker"]
    assert next(args for op, args in instructions if op == "FROM").startswith("python:3.11")
    users = [args for op, args in instructions if op == "USER"]
    assert users[-1] == "10001"
    images = {
        c["image"].split(":")[0]
        for d in by_kind("Deployment") + by_kind("Job")
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"tollfree", "tollfree-worker"}
    modules = re.findall(r'"-m", "([\w.]+)"', DOCKERFILE.read_text())
    for module in modules:
        assert (PROJECT_DIR / Path(*module.split("."))).exists() or (
            PROJECT_DIR / Path(*module.split("."))
        ).with_suffix(".py").exists()


# ---- metrics: dashboard and docs ----------------------------------------------------------------


def exposed_metric_names() -> set[str]:
    """Every metric name (as in the exposition's ``# TYPE`` lines) of the gateway's registry and the inference log's."""
    from prometheus_client import CollectorRegistry, generate_latest

    from serving.gateway.metrics import GatewayMetrics
    from serving.inference_log import InferenceLogWriter

    log_registry = CollectorRegistry()
    InferenceLogWriter(Path("/nonexistent"), registry=log_registry)  # no I/O until started
    text = (generate_latest(GatewayMetrics.create().registry) + generate_latest(log_registry)).decode()
    names = set(re.findall(r"^# TYPE (\S+) ", text, flags=re.MULTILINE))
    return {n for n in names if not n.endswith("_created")}  # prometheus_client's per-counter creation stamps


def autoscaler_metric_names() -> set[str]:
    """The autoscaler controller's metric families (counters exposed with ``_total``)."""
    source = (PROJECT_DIR / "serving" / "autoscaler" / "controller.py").read_text()
    names = set()
    for kind, name in re.findall(r'(Gauge|Counter)MetricFamily\(\s*"(tollfree_autoscaler_\w+)"', source):
        names.add(name + "_total" if kind == "Counter" and not name.endswith("_total") else name)
    return names


def test_the_metrics_page_documents_every_metric_name_the_gateway_and_the_autoscaler_expose():
    page = (PROJECT_DIR / "docs" / "reference" / "metrics.md").read_text()
    assert {"tollfree_autoscaler_desired_replicas", "tollfree_autoscaler_ready_replicas"} <= autoscaler_metric_names()
    missing = [name for name in sorted(exposed_metric_names() | autoscaler_metric_names()) if name not in page]
    assert not missing, f"docs/reference/metrics.md does not document: {missing}"


def test_the_prometheus_rules_read_only_metrics_that_exist_or_that_a_rule_records():
    from infra.prometheus import RULES

    rules = [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    recorded = {rule["record"] for rule in rules if "record" in rule}
    names = {n for rule in rules for n in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", rule["expr"])}
    assert {n for n in names if ":" in n} <= recorded, {n for n in names if ":" in n} - recorded
    used = {re.sub(r"_(bucket|count|sum|total)$", "", n) for n in names if n.startswith("tollfree_")}
    known = {re.sub(r"_total$", "", n) for n in exposed_metric_names() | autoscaler_metric_names()}
    assert used <= known, used - known
    assert {"tollfree_requests", "tollfree_max_replicas", "tollfree_latency_slo_seconds"} <= used


def test_grafana_dashboard_queries_only_metrics_that_exist():
    dashboard = json.loads((PROJECT_DIR / "infra" / "grafana" / "tollfree-serving.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {re.sub(r"_(bucket|count|sum|total)$", "", m) for e in exprs for m in re.findall(r"\b(tollfree_\w+)", e)}
    known = {re.sub(r"_total$", "", n) for n in exposed_metric_names() | autoscaler_metric_names()}
    assert used <= known, used - known
    assert {"tollfree_autoscaler_desired_replicas", "tollfree_autoscaler_ready_replicas"} <= used
    assert known <= used  # every metric has a panel
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
