"""One official client of the Open Inference Protocol against a gateway, run as its own process:
``python -m tests.e2e.oip_clients CLIENT CASES.json`` prints one JSON result per operation and mode.

Each client runs in a process of its own because tritonclient's and KServe's compiled protos both define the
``inference`` package: the two cannot be imported into one Python process (protobuf refuses the second).

CLIENT: ``tritonclient.http``, ``tritonclient.grpc``, ``kserve.rest`` or ``kserve.grpc``. CASES holds the gateway's
URLs, the admin token, and models with input columns and the MLflow route's predictions for them; a result passes
when the client's call succeeds and, for inference, gives those predictions.
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

Check = Callable[[], Any]


def _array(column: dict[str, Any]) -> np.ndarray:
    if column["datatype"] == "BYTES":
        return np.array([v.encode() for v in column["values"]], dtype=np.object_)
    dtype = {"BOOL": np.bool_, "INT64": np.int64, "FP64": np.float64, "FP32": np.float32, "INT32": np.int32}
    return np.array(column["values"], dtype=dtype[column["datatype"]])


def _same(got: np.ndarray, expected: list[Any]) -> None:
    got = np.asarray(got).reshape(len(expected), -1).squeeze(-1) if np.asarray(got).size == len(expected) else got
    values = [v.decode() if isinstance(v, bytes) else v for v in np.asarray(got).tolist()]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in [*values, *expected]):
        if not np.allclose(values, expected, rtol=1e-9, atol=1e-12):
            raise AssertionError("predictions differ from the MLflow route's")
    elif values != expected:
        raise AssertionError("predictions differ from the MLflow route's")


def _triton_http(cases: dict[str, Any]) -> list[tuple[str, str, Check]]:
    import tritonclient.http as client_module

    client = client_module.InferenceServerClient(url=cases["rest"].removeprefix("http://"), network_timeout=60)
    headers = {"Authorization": f"Bearer {cases['token']}"}
    checks: list[tuple[str, str, Check]] = []
    for mode, binary in (("binary", True), ("JSON", False)):
        checks += [
            (mode, "GET /v2/health/live", lambda: _true(client.is_server_live(headers=headers))),
            (mode, "GET /v2/health/ready", lambda: _true(client.is_server_ready(headers=headers))),
            (mode, "GET /v2", lambda: _equal(client.get_server_metadata(headers=headers)["name"], "tollfree")),
        ]
        for model in cases["models"]:
            name, version = model["name"], model["version"]
            checks += [
                (
                    mode,
                    "GET /v2/models/{name}",
                    lambda m=model: _inputs(client.get_model_metadata(m["name"], headers=headers), m),
                ),
                (
                    mode,
                    "GET /v2/models/{name}/versions/{version}",
                    lambda m=model: _inputs(client.get_model_metadata(m["name"], m["version"], headers=headers), m),
                ),
                (mode, "GET /v2/models/{name}/ready", lambda n=name: _true(client.is_model_ready(n, headers=headers))),
                (
                    mode,
                    "GET /v2/models/{name}/versions/{version}/ready",
                    lambda n=name, v=version: _true(client.is_model_ready(n, v, headers=headers)),
                ),
            ]
            for route, pinned in (
                ("POST /v2/models/{name}/infer", ""),
                ("POST /v2/models/{name}/versions/{version}/infer", version),
            ):

                def infer(m: dict[str, Any] = model, b: bool = binary, v: str = pinned) -> None:
                    inputs = []
                    for column in m["inputs"]:
                        tensor = client_module.InferInput(column["name"], [len(column["values"])], column["datatype"])
                        tensor.set_data_from_numpy(_array(column), binary_data=b)
                        inputs.append(tensor)
                    outputs = [client_module.InferRequestedOutput(m["output"], binary_data=b)]
                    # a copy: tritonclient adds its binary data header to the dict it is given
                    result = client.infer(m["name"], inputs, model_version=v, outputs=outputs, headers=dict(headers))
                    _same(result.as_numpy(m["output"]), m["expected"])

                checks.append((mode, route, infer))
    return checks


def _triton_grpc(cases: dict[str, Any]) -> list[tuple[str, str, Check]]:
    import tritonclient.grpc as client_module

    client = client_module.InferenceServerClient(url=cases["grpc"])
    headers = {"authorization": f"Bearer {cases['token']}"}
    mode = "raw"
    checks: list[tuple[str, str, Check]] = [
        (mode, "ServerLive", lambda: _true(client.is_server_live(headers=headers))),
        (mode, "ServerReady", lambda: _true(client.is_server_ready(headers=headers))),
        (mode, "ServerMetadata", lambda: _equal(client.get_server_metadata(headers=headers).name, "tollfree")),
    ]
    for model in cases["models"]:
        name, version = model["name"], model["version"]
        checks += [
            (
                mode,
                "ModelMetadata",
                lambda m=model: _inputs(client.get_model_metadata(m["name"], headers=headers, as_json=True), m),
            ),
            (
                mode,
                "ModelMetadata (version)",
                lambda m=model: _inputs(
                    client.get_model_metadata(m["name"], m["version"], headers=headers, as_json=True), m
                ),
            ),
            (mode, "ModelReady", lambda n=name: _true(client.is_model_ready(n, headers=headers))),
            (
                mode,
                "ModelReady (version)",
                lambda n=name, v=version: _true(client.is_model_ready(n, v, headers=headers)),
            ),
        ]
        for method, pinned in (("ModelInfer", ""), ("ModelInfer (version)", version)):

            def infer(m: dict[str, Any] = model, v: str = pinned) -> None:
                inputs = []
                for column in m["inputs"]:
                    tensor = client_module.InferInput(column["name"], [len(column["values"])], column["datatype"])
                    tensor.set_data_from_numpy(_array(column))
                    inputs.append(tensor)
                outputs = [client_module.InferRequestedOutput(m["output"])]
                result = client.infer(m["name"], inputs, model_version=v, outputs=outputs, headers=headers)
                _same(result.as_numpy(m["output"]), m["expected"])

            checks.append((mode, method, infer))
    return checks


def _kserve(cases: dict[str, Any], transport: str) -> list[tuple[str, str, Check]]:
    from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # grpc.aio's channel belongs to the loop current when it is made
    run: Callable[[Awaitable[Any]], Any] = loop.run_until_complete
    token = f"Bearer {cases['token']}"
    checks: list[tuple[str, str, Check]] = []
    if transport == "rest":
        rest = InferenceRESTClient(RESTConfig(protocol="v2", timeout=60))
        base, headers = cases["rest"], {"Authorization": token}
        modes = (("binary", True), ("JSON", False))
        routes = {
            "live": "GET /v2/health/live",
            "ready": "GET /v2/health/ready",
            "model": "GET /v2/models/{name}/ready",
            "infer": "POST /v2/models/{name}/infer",
        }
        live = lambda: rest.is_server_live(base, headers=headers)  # noqa: E731
        ready = lambda: rest.is_server_ready(base, headers=headers)  # noqa: E731
        model_ready = lambda n: rest.is_model_ready(base, n, headers=headers)  # noqa: E731
        infer_call = lambda r, n: rest.infer(base, r, model_name=n, headers=dict(headers))  # noqa: E731
    else:
        grpc = InferenceGRPCClient(cases["grpc"], timeout=60, retries=0)
        metadata = (("authorization", token),)
        modes = (("raw", True), ("typed contents", False))
        routes = {"live": "ServerLive", "ready": "ServerReady", "model": "ModelReady", "infer": "ModelInfer"}
        live = lambda: grpc.is_server_live(headers=metadata)  # noqa: E731
        ready = lambda: grpc.is_server_ready(headers=metadata)  # noqa: E731
        model_ready = lambda n: grpc.is_model_ready(n, headers=metadata)  # noqa: E731
        infer_call = lambda r, n: grpc.infer(r, headers=metadata)  # noqa: E731
    for mode, binary in modes:
        checks += [
            (mode, routes["live"], lambda: _true(run(live()))),
            (mode, routes["ready"], lambda: _true(run(ready()))),
        ]
        for model in cases["models"]:
            checks.append((mode, routes["model"], lambda n=model["name"]: _true(run(model_ready(n)))))

            def infer(m: dict[str, Any] = model, b: bool = binary) -> None:
                inputs = []
                for column in m["inputs"]:
                    tensor = InferInput(column["name"], [len(column["values"])], column["datatype"])
                    tensor.set_data_from_numpy(_array(column), binary_data=b)
                    inputs.append(tensor)
                result = run(infer_call(InferRequest(m["name"], inputs, request_id="conformance"), m["name"]))
                (output,) = [o for o in result.outputs if o.name == m["output"]]
                _same(output.as_numpy(), m["expected"])

            checks.append((mode, routes["infer"], infer))
    return checks


def _true(value: Any) -> None:
    if value is not True:
        raise AssertionError(f"answered {value!r}, not True")


def _equal(value: Any, expected: Any) -> None:
    if value != expected:
        raise AssertionError(f"answered {value!r}, not {expected!r}")


def _inputs(metadata: dict[str, Any], model: dict[str, Any]) -> None:
    names = {i["name"] for i in metadata["inputs"]}
    if names != {c["name"] for c in model["inputs"]}:
        raise AssertionError(f"metadata lists inputs {sorted(names)}")


CLIENTS: dict[str, Callable[[dict[str, Any]], list[tuple[str, str, Check]]]] = {
    "tritonclient.http": _triton_http,
    "tritonclient.grpc": _triton_grpc,
    "kserve.rest": lambda cases: _kserve(cases, "rest"),
    "kserve.grpc": lambda cases: _kserve(cases, "grpc"),
}


def main(argv: list[str]) -> int:
    client_name, cases_path = argv
    with open(cases_path) as f:
        cases = json.load(f)
    results = []
    for mode, operation, check in CLIENTS[client_name](cases):
        try:
            check()
            results.append({"client": client_name, "mode": mode, "operation": operation, "passed": True})
        except Exception as exc:
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()[:300]
            results.append(
                {"client": client_name, "mode": mode, "operation": operation, "passed": False, "detail": detail}
            )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
