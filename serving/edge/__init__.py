"""Edge serving, home's side: bundles made from registered versions, and the fleet of devices that serve them.

- ``bundling``: a version converted to ONNX, verified against the original, written as a signed bundle;
- ``signing``: the publisher's Ed25519 key pair;
- ``rollouts``: the staged rollout of a bundle to a device group (pure decisions, the clock passed in);
- ``fleet``: devices, groups and rollouts in the state store;
- ``api``: the gateway's routes devices poll (desired bundle, status, telemetry) and operators drive.

The device's side is the ``tollfree_edge`` package (``edge/``), which imports nothing of this.
"""
