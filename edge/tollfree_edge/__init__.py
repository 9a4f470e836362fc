"""tollfree's edge runtime: serve one signed model bundle on a device, with or without a link home.

- ``bundle``: the bundle format and the check (signature, then digests) that runs before anything loads;
- ``model``: a verified bundle's ONNX session and its on-device smoke test;
- ``scoring``: the MLflow scoring protocol's request bodies, read into the model's columns;
- ``server``: the local HTTP server (``/invocations``, ``/ping``), whose model is swapped with no dropped request;
- ``slots``: the bundles a device keeps (current and previous) and the swap with its rollback;
- ``telemetry``: inference records kept on the device, bounded, until they are uploaded;
- ``agent``: the loop that polls home for the desired bundle, reports status and uploads telemetry.

It imports onnxruntime, numpy and cryptography, and the standard library: nothing of the rest of tollfree.
"""
