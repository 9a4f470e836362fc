"""The Open Inference Protocol's gRPC messages and service, generated at build time from ``grpc_predict_v2.proto``
(``hatch_build.py``)."""
