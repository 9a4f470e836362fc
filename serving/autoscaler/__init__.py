"""The two-axis autoscaler: signals -> policy -> controller -> backends (ARCHITECTURE.md). Pure: it imports
nothing else of serving; the backends are in :mod:`serving.replicas`, the loop in the gateway in
:mod:`serving.gateway.autoscaling`.

* :mod:`.signals` -- per-second samples and their bounded history;
* :mod:`.config` -- the validated scaling config (bad fields raise ``ScalingConfigError`` naming them);
* :mod:`.policy` -- pure ``decide(config, signals, state, now) -> (decision, state)``;
* :mod:`.controller` -- the loop over a ``SignalSource`` and a ``Backend``, retries, decision history;
* :mod:`.simulate` -- the discrete-event simulator and the HPA / KPA / Ray Serve baselines.
"""
