"""The two-axis autoscaler: signals -> policy -> controller -> backends (ARCHITECTURE.md).

* :mod:`.signals` -- per-second samples, their bounded history, max/mean windows;
* :mod:`.config` -- the validated scaling config (bad fields raise ``ScalingConfigError`` naming them);
* :mod:`.policy` -- pure ``decide(config, signals, state, now) -> (decision, state)``;
* :mod:`.controller` -- the loop over a ``SignalSource`` and a ``Backend``, retries, decision history;
* :mod:`.backends.kubernetes` -- Deployments' scale subresource;
* :mod:`.simulate` -- the discrete-event simulator and the HPA / KPA / Ray Serve baselines.
"""
