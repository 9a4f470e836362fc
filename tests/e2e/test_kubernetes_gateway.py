"""A real gateway process with ``TOLLFREE_BACKEND=kubernetes``, its credentials from a kubeconfig, against the
stand-in API server of ``tests/k8s_api.py``, whose "kubelet" runs each pod as a real replica process on loopback
(the model from the Deployment's command, the token from the environment the Secret would give it; ready when
its readiness probe answers).

What must hold: the endpoint is served from the pod the gateway's Deployment asked for (real predictions,
through the replica token); a ``kill -9`` of the gateway and a new start on the same state adopt the same
Deployment and pod (no pod made anew) and serve again; deleting the endpoint deletes the Deployment and so the
pod. What is not run for real: an API server, a scheduler, container images.
"""

from __future__ import annotations

import os
import signal

import httpx
import pytest
import yaml

from serving.gateway.process import environ_with, start_gateway
from tests.gateways import ENTITY, rows_body, wait_ready
from tests.k8s_api import FakeKubernetes, LocalPods, serve

pytestmark = pytest.mark.slow

NAME = "fraud-k8s"


def test_a_gateway_process_on_kubernetes_serves_from_its_pods_and_a_restart_adopts_them(world, tmp_path):
    token = "replica-" + os.urandom(16).hex()
    pods = LocalPods(environ_with({"TOLLFREE_REPLICA_TOKEN": token}), world.home / "logs")
    fake = FakeKubernetes(namespace="tollfree", pods=pods)
    admin = {"Authorization": f"Bearer {os.environ['TOLLFREE_TOKEN']}"}
    with serve(fake) as api_url:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "here",
                    "clusters": [{"name": "here", "cluster": {"server": api_url}}],
                    "users": [{"name": "gateway", "user": {"token": "not-checked-by-the-stand-in"}}],
                    "contexts": [
                        {"name": "here", "context": {"cluster": "here", "user": "gateway", "namespace": "tollfree"}}
                    ],
                }
            )
        )
        env = environ_with(
            {
                "TOLLFREE_BACKEND": "kubernetes",
                "KUBECONFIG": str(kubeconfig),
                "TOLLFREE_K8S_NAMESPACE": "tollfree",
                "TOLLFREE_REPLICA_TOKEN": token,
                "TOLLFREE_STATE_URL": f"sqlite:///{tmp_path / 'endpoints.db'}",
            }
        )
        gateway = start_gateway(env, world.home / "logs" / "gateway-k8s.log", timeout_s=240)
        try:
            created = httpx.post(
                f"{gateway.url}/api/2.0/serving-endpoints",
                headers=admin,
                timeout=60,
                json={"name": NAME, "config": {"served_entities": [ENTITY]}},
            )
            assert created.status_code == 200, created.text
            wait_ready(gateway.url, NAME)
            [deployment] = fake.deployments()
            assert len(pods.started) == 1
            body = rows_body(world, n=4)
            path = f"/serving-endpoints/{NAME}/invocations"
            answer = httpx.post(
                gateway.url + path, content=body, timeout=60, headers={**admin, "content-type": "application/json"}
            )
            assert answer.status_code == 200, answer.text
            assert len(answer.json()["predictions"]) == 4

            gateway.process.send_signal(signal.SIGKILL)
            gateway.process.wait(30)
            gateway = start_gateway(env, world.home / "logs" / "gateway-k8s-2.log", timeout_s=240)
            wait_ready(gateway.url, NAME)
            again = httpx.post(
                gateway.url + path, content=body, timeout=60, headers={**admin, "content-type": "application/json"}
            )
            assert again.status_code == 200 and again.json() == answer.json()
            assert fake.deployments() == {deployment: 1} and len(pods.started) == 1  # the same pod, adopted

            deleted = httpx.delete(f"{gateway.url}/api/2.0/serving-endpoints/{NAME}", headers=admin, timeout=60)
            assert deleted.status_code == 200
            assert fake.deployments() == {}
            pods.started[0].process.wait(30)  # the kubelet stopped the pod's process
        finally:
            gateway.stop()
    assert not fake.refused
