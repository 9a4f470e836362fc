"""The build's one step beyond packaging: the Open Inference Protocol's gRPC service definition
(``serving/protocol/v2/grpc_predict_v2.proto``, the specification's own file) compiled into its Python messages and
service stubs with grpcio-tools, beside the proto. The generated modules are not committed; every build (``uv sync``'s
editable install, a wheel) makes them, and a wheel carries them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PROTO = "serving/protocol/v2/grpc_predict_v2.proto"
GENERATED = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


class CompileProtos(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        from grpc_tools import protoc

        root = Path(self.root)
        outputs = [f"--{kind}_out={root}" for kind in ("python", "pyi", "grpc_python")]
        status = protoc.main(["protoc", f"-I{root}", *outputs, str(root / PROTO)])
        if status != 0:
            raise RuntimeError(f"grpcio-tools could not compile {PROTO} (protoc exit status {status})")
        stem = PROTO.removesuffix(".proto")
        build_data["artifacts"].extend(stem + suffix for suffix in GENERATED)  # generated, so git ignores them
