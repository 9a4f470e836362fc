"""The Kubernetes objects of a served entity, rendered from the shipped replica template (pure, no API), and the
ready pods read from an EndpointSlice."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from serving.replicas.cluster.connect import DEFAULT_TEMPLATE, ClusterSettingsError, backend_name, from_environ
from serving.replicas.cluster.objects import (
    REPLICA_SET_LABEL,
    RESOURCES,
    ReplicaTemplate,
    TemplateError,
    Wanted,
    object_name,
    owned_by,
)
from serving.replicas.cluster.routes import PodReplica, Routes, ready_pods

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def test_names_are_dns_labels_that_tell_two_versions_of_an_entity_apart():
    one, two = (
        object_name("Fraud_API", "champion.v2", "models:/fraud/1"),
        object_name("Fraud_API", "champion.v2", "models:/fraud/2"),
    )
    assert one != two and one.startswith("tollfree-fraud-api-champion-v2-")
    for name in (one, object_name("e" * 63, "s" * 128, "models:/m/1"), object_name("___", "_", "models:/m/1")):
        assert len(name) <= 63 and DNS_LABEL.match(name), name


def test_render_fills_in_the_entity_and_keeps_the_rest_of_the_template():
    template = ReplicaTemplate.load(DEFAULT_TEMPLATE, image="registry.example/tollfree:9")
    wanted = Wanted("fraud", "champion", "models:/fraud/7", "Medium")
    objects = template.render(wanted, 3)
    deployment, service, budget = objects["Deployment"], objects["Service"], objects["PodDisruptionBudget"]
    name = wanted.name
    assert {o["metadata"]["name"] for o in objects.values()} == {name}
    assert deployment["spec"]["replicas"] == 3
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector == {"app.kubernetes.io/name": "tollfree-replica", REPLICA_SET_LABEL: name}
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"]["selector"] == selector and budget["spec"]["selector"]["matchLabels"] == selector
    assert service["spec"]["clusterIP"] == "None"  # headless: the gateways route to the pods themselves
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"][container["command"].index("--model-uri") + 1] == "models:/fraud/7"
    assert container["resources"] == RESOURCES["Medium"] and container["image"] == "registry.example/tollfree:9"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health/ready"  # the template's own, kept
    assert deployment["metadata"]["annotations"]["tollfree.io/model-uri"] == "models:/fraud/7"
    for obj in objects.values():
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "tollfree-gateway"
    owned = owned_by(service, name, "uid-1")
    assert owned["metadata"]["ownerReferences"][0] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": name,
        "uid": "uid-1",
        "controller": True,
        "blockOwnerDeletion": False,
    }
    assert "ownerReferences" not in service["metadata"]  # rendering twice gives the same objects


@pytest.mark.parametrize(
    "text, complaint",
    [
        ("kind: Service\nmetadata: {name: x}\nspec: {}\n", "needs a Deployment and a Service"),
        ("kind: Pod\n", "may hold only"),
        (
            "kind: Deployment\nspec: {template: {spec: {containers: [{name: other}]}}}\n---\nkind: Service\nspec: {}\n",
            "no container named 'replica'",
        ),
        (
            "kind: Deployment\nspec: {template: {spec: {containers: [{name: replica, command: [python]}]}}}\n---\n"
            "kind: Service\nspec: {}\n",
            "must pass --model-uri",
        ),
    ],
)
def test_a_template_missing_what_is_filled_in_is_refused_when_loaded(tmp_path: Path, text, complaint):
    path = tmp_path / "template.yaml"
    path.write_text(text)
    with pytest.raises(TemplateError, match=complaint):
        ReplicaTemplate.load(path)


def test_settings_name_what_is_missing(tmp_path: Path):
    with pytest.raises(ClusterSettingsError, match="TOLLFREE_BACKEND must be one of local, kubernetes"):
        backend_name({"TOLLFREE_BACKEND": "nomad"})
    assert backend_name({}) == "local"
    with pytest.raises(ClusterSettingsError, match="needs TOLLFREE_REPLICA_TOKEN"):
        from_environ({}, api_client=object())
    with pytest.raises(ClusterSettingsError, match="TOLLFREE_K8S_NAMESPACE is not set and this is not a pod"):
        from_environ({"TOLLFREE_REPLICA_TOKEN": "t"}, api_client=object(), namespace_file=tmp_path / "none")
    (tmp_path / "namespace").write_text("serving\n")
    with pytest.raises(ClusterSettingsError, match="is unreadable"):
        from_environ(
            {"TOLLFREE_REPLICA_TOKEN": "t", "TOLLFREE_K8S_TEMPLATE": str(tmp_path / "missing.yaml")},
            api_client=object(),
            namespace_file=tmp_path / "namespace",
        )


def _slice(name: str, service: str, endpoints, port: int = 8000):  # type: ignore[no-untyped-def]
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": port}],
    }


def test_ready_pods_are_those_not_unready_and_not_terminating():
    endpoints = [
        {"addresses": ["10.0.0.1"], "conditions": {"ready": True}, "targetRef": {"name": "a"}},
        {"addresses": ["10.0.0.2"], "conditions": {}, "targetRef": {"name": "b"}},  # unset: ready
        {"addresses": ["10.0.0.3"], "conditions": {"ready": False}, "targetRef": {"name": "c"}},
        {"addresses": ["10.0.0.4"], "conditions": {"ready": True, "terminating": True}},
        {"addresses": [], "conditions": {"ready": True}},
    ]
    assert ready_pods(_slice("s", "svc", endpoints)) == [("10.0.0.1", 8000, "a"), ("10.0.0.2", 8000, "b")]
    assert ready_pods(_slice("s", "svc", None)) == []  # a Service without pods: endpoints null


def test_routes_join_an_entitys_slices_keep_pod_objects_and_tell_only_who_changed():
    routes = Routes("tollfree")
    seen: dict[str, list[list[str]]] = {"svc": [], "other": []}
    for name in seen:
        routes.subscribe(name, lambda pods, n=name: seen[n].append([p.url for p in pods]))
    routes.replace([_slice("s1", "svc", [{"addresses": ["10.0.0.1"], "targetRef": {"name": "a"}}])])
    first = routes.pods("svc")[0]
    first.outstanding = 3
    routes.event("ADDED", _slice("s2", "svc", [{"addresses": ["10.0.0.2"], "targetRef": {"name": "b"}}], port=9000))
    assert [p.url for p in routes.pods("svc")] == ["http://10.0.0.1:8000", "http://10.0.0.2:9000"]
    assert routes.pods("svc")[0] is first and first.outstanding == 3  # its count survives the change
    routes.event("DELETED", _slice("s1", "svc", None))
    assert [p.url for p in routes.pods("svc")] == ["http://10.0.0.2:9000"]
    assert seen["svc"] == [
        [],
        ["http://10.0.0.1:8000"],
        ["http://10.0.0.1:8000", "http://10.0.0.2:9000"],
        ["http://10.0.0.2:9000"],
    ]
    assert seen["other"] == [[]]
    assert first.id == "pod:tollfree/a" and first.pid is None  # known by its name; no process on this machine


def test_an_ipv6_pod_address_is_bracketed_in_its_url():
    assert PodReplica("fd00::5", 8000, "a", "tollfree").url == "http://[fd00::5]:8000"


def test_the_gateway_refuses_to_start_on_kubernetes_without_the_replica_token(monkeypatch, capsys):
    from serving.__main__ import main

    monkeypatch.setenv("TOLLFREE_TOKEN", "unit-test-admin-token-0123456789")
    monkeypatch.setenv("TOLLFREE_BACKEND", "kubernetes")
    monkeypatch.delenv("TOLLFREE_REPLICA_TOKEN", raising=False)
    assert main(["--port", "1"]) == 2
    assert "TOLLFREE_BACKEND=kubernetes needs TOLLFREE_REPLICA_TOKEN" in capsys.readouterr().err
