"""The model's lifecycle in the MLflow registry, one package for the gateway, batch scoring and the flows.

- ``versions``: a model version from a version number or an alias (``resolve``, the one place that
  happens), a model's aliases, where a version's training data is, the experiments runs go to;
- ``errors``: an unreachable registry told apart from an answer, and named;
- ``lifecycle``: the alias moves ``candidate`` -> ``challenger`` -> ``champion``, ``previous``, rollback;
- ``gates`` and ``promotion_policy``: the promotion gates (pure) and the loader of the per-model policy files that
  declare them (the files are the promote flow's, in ``flows/promotion_policies/``);
- ``canary_steps``: the canary's state machine (pure); ``canary_store``: its state between runs and the lock
  that lets one run act; ``endpoint_traffic``: the endpoint configs its traffic moves send through the
  gateway's API; ``canary``: its moves on an endpoint and in the registry.

No Prefect here, and nothing from ``flows/`` or ``monitoring/``: the flows call this package, never the
other way round. The package imports nothing itself, so the gateway, which needs ``versions`` alone,
loads no more than that; MLflow is imported when a registry call runs.
"""
