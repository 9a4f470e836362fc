"""One model replica: the process that loads an MLflow model and answers the scoring protocol.

Started as ``python -m serving.replica_server`` (``__main__``), or forked from the gateway's fork server, which runs
the same ``main``; the gateway process never imports this package.

    app      the replica's ASGI app: its routes, the predict thread
    scoring  a request or an envelope of several parsed, predicted and answered (no HTTP)
    asgi     what every replica app does alike: lifespan, body, answer, probes and metrics routes
    standby  the warm pool's standby app, which loads a model and becomes the replica's app
    runtime  the loaded model: online features, the numpy fast path, batch predict, profiling
    metrics  the replica's Prometheus metrics and its busy clock
    fork_server  ``python -m serving.replica_server.fork_server``: the runtime imported once, replicas forked from it
"""
