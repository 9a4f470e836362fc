"""The Kubernetes backend through the official client, with the ApiClient's HTTP layer replaced.

No Kubernetes API server runs on these machines: the fake pool manager below answers like one, with
bodies built from the client's own models, so paths, verbs, patch bodies and deserialisation are the
real client's; a real cluster is not exercised.
"""

from __future__ import annotations

import json

import pytest
import urllib3
from kubernetes import client as k8s

from serving.autoscaler.config import ScalingConfig
from serving.autoscaler.controller import Controller, RetryPolicy
from serving.autoscaler.signals import Sample
from serving.replicas.kubernetes import KubernetesBackend, deployment_name


class FakeApiServer:
    """Answers the scale and status reads/patches of Deployments in one namespace."""

    def __init__(self, api: k8s.ApiClient, replicas: int = 2, ready: int = 2) -> None:
        self.api = api
        self.replicas = replicas
        self.ready = ready
        self.requests: list[tuple[str, str, dict | None, str | None]] = []
        self.fail_next: list[int] = []

    def _json(self, model, status: int = 200) -> urllib3.HTTPResponse:
        body = json.dumps(self.api.sanitize_for_serialization(model)).encode()
        return urllib3.HTTPResponse(body=body, status=status, headers={"Content-Type": "application/json"},
                                    preload_content=False)

    def request(self, method, url, body=None, headers=None, **kw):
        path = urllib3.util.parse_url(url).path
        self.requests.append((method, path, json.loads(body) if body else None, (headers or {}).get("Content-Type")))
        if self.fail_next and path.endswith("/scale"):
            status = self.fail_next.pop(0)
            status_model = k8s.V1Status(code=status, message="forbidden", reason="Forbidden", status="Failure")
            return self._json(status_model, status)
        name = path.split("/")[6]
        meta = k8s.V1ObjectMeta(name=name, namespace="serving")
        if path.endswith("/scale"):
            if method == "PATCH":
                self.replicas = json.loads(body)["spec"]["replicas"]
            return self._json(k8s.V1Scale(api_version="autoscaling/v1", kind="Scale", metadata=meta,
                                          spec=k8s.V1ScaleSpec(replicas=self.replicas),
                                          status=k8s.V1ScaleStatus(replicas=self.replicas)))
        if path.endswith("/status"):
            spec = k8s.V1DeploymentSpec(
                replicas=self.replicas, selector=k8s.V1LabelSelector(match_labels={"app": name}),
                template=k8s.V1PodTemplateSpec(spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="replica")])))
            return self._json(k8s.V1Deployment(api_version="apps/v1", kind="Deployment", metadata=meta, spec=spec,
                                               status=k8s.V1DeploymentStatus(replicas=self.replicas,
                                                                             ready_replicas=self.ready)))
        raise AssertionError(f"unexpected request {method} {path}")


@pytest.fixture()
def cluster():
    api = k8s.ApiClient(k8s.Configuration(host="https://k8s.invalid"))
    server = FakeApiServer(api)
    api.rest_client.pool_manager = server
    return KubernetesBackend("serving", api), server


def test_set_replicas_patches_the_scale_subresource(cluster):
    backend, server = cluster
    backend.set_replicas("fraud", "champion", 5)
    (m1, p1, _, _), (m2, p2, body, ctype) = server.requests
    path = "/apis/apps/v1/namespaces/serving/deployments/tollfree-fraud-champion/scale"
    assert (m1, p1) == ("GET", path)
    assert (m2, p2, body, ctype) == ("PATCH", path, {"spec": {"replicas": 5}}, "application/merge-patch+json")
    assert server.replicas == 5


def test_no_patch_when_the_count_is_already_right(cluster):
    backend, server = cluster
    backend.set_replicas("fraud", "champion", 2)
    assert [m for m, *_ in server.requests] == ["GET"]


def test_ready_replicas_reads_the_deployment_status(cluster):
    backend, server = cluster
    server.ready = 1
    assert backend.ready_replicas("fraud", "champion") == 1
    assert server.requests[-1][:2] == ("GET", "/apis/apps/v1/namespaces/serving/deployments/tollfree-fraud-champion/status")


def test_an_api_error_is_retried_by_the_controller(cluster):
    backend, server = cluster
    key = ("fraud", "champion")

    class Source:
        def sample(self, now):
            return {key: Sample(t=now, in_flight=60.0, ready_replicas=2, requests=600, completed=600)}

    controller = Controller(Source(), backend, {key: ScalingConfig(vertical=False, initial_target=10.0)},
                            retry=RetryPolicy(base_s=1.0))
    server.fail_next = [403]
    for t in range(1, 8):
        controller.step(float(t))
    records = [r for r in controller.export() if r["applied"] is not None]
    assert records[0]["applied"] is False and "Forbidden" in records[0]["error"]
    assert records[-1]["applied"] is True and server.replicas == 6


def test_deployment_names_are_dns_labels():
    assert deployment_name("Fraud_API", "champion.v2") == "tollfree-fraud-api-champion-v2"
    assert len(deployment_name("e" * 60, "s" * 60)) <= 63
