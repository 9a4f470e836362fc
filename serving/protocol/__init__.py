"""What the gateway, its replicas and clients agree on; imports nothing else of serving.

scoring  the MLflow scoring protocol: request parsing, canonical payload keys, JSON output
wire     the gateway-replica envelope: batch requests and answers, headers, the replica token
errors   ``{"error_code", "message"}`` errors, request ids, FastAPI error handlers
"""
