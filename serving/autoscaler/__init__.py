"""The two-axis autoscaler: signals -> policy -> controller -> actuator. Pure: it imports
nothing else of serving; the replica sets that apply its counts are in :mod:`serving.replicas`, the loop in
the gateway in :mod:`serving.gateway.autoscaling`.

* :mod:`.signals` -- per-second samples and their bounded history;
* :mod:`.config` -- the validated scaling config (bad fields raise ``ScalingConfigError`` naming them);
* :mod:`.policy` -- pure ``decide(config, signals, state, now) -> (decision, state)``;
* :mod:`.controller` -- the loop over a ``SignalSource`` and an ``Actuator``, retries, decision history.

The discrete-event simulator that runs the same policy offline, and the HPA / KPA / Ray Serve baselines, are a
tool beside the package: the top-level ``simulator`` package (``python -m simulator``).
"""
