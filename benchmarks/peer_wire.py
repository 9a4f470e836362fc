"""The peers' native request and answer formats (benchmarks/peer_servers.py starts the peers that speak them)."""

from __future__ import annotations

import json
from typing import Any

MODEL_NAME = "peer"  # the name every peer serves its model under


def v2_request(rows: list) -> dict[str, Any]:
    """Open Inference (V2): numeric rows as one FP64 tensor; records as a pandas-codec request."""
    if not (rows and isinstance(rows[0], dict)):
        width = len(rows[0]) if rows else 0
        return {
            "inputs": [
                {
                    "name": "input-0",
                    "shape": [len(rows), width],
                    "datatype": "FP64",
                    "data": [float(v) for row in rows for v in row],
                }
            ]
        }
    inputs = []
    for column, first in rows[0].items():
        values = [row[column] for row in rows]
        if isinstance(first, str):
            inputs.append(
                {
                    "name": column,
                    "shape": [len(rows)],
                    "datatype": "BYTES",
                    "data": values,
                    "parameters": {"content_type": "str"},
                }
            )
        else:
            inputs.append(
                {"name": column, "shape": [len(rows)], "datatype": "FP64", "data": [float(v) for v in values]}
            )
    return {"parameters": {"content_type": "pd"}, "inputs": inputs}


def request_for(kind: str, rows: list) -> tuple[str, str, dict[str, str]]:
    """(path, JSON body, extra headers) of one request carrying `rows` in the peer's native format."""
    headers = {"Content-Type": "application/json"}
    if kind == "mlserver":
        return f"/v2/models/{MODEL_NAME}/infer", json.dumps(v2_request(rows)), headers
    paths = {"bentoml": "/predict", "rayserve": "/", "kserve": f"/v1/models/{MODEL_NAME}:predict", "uvicorn": "/"}
    if kind not in paths:
        raise KeyError(f"unknown peer {kind!r}")
    return paths[kind], json.dumps({"instances": rows}), headers


def predictions_of(kind: str, answer_json: Any) -> list:
    """The predicted labels in a peer's answer (parsed JSON or its text)."""
    answer = json.loads(answer_json) if isinstance(answer_json, (str, bytes)) else answer_json
    if kind == "mlserver":
        return list(answer["outputs"][0]["data"])
    if kind == "bentoml":
        return list(answer)
    return list(answer["predictions"])
