"""The gateway's side of its replicas: start, stop, reach and measure them.

    local          replicas as local OS processes (``python -m serving.replica``): start, ready, stop
    client         the keep-alive client that sends batch envelopes to a replica
    warm_pool      standby processes with the runtime imported, waiting for a model
    local_backend  the autoscaler's backend on local processes (warm pool first)
    kubernetes     the autoscaler's backend on Kubernetes Deployments (scale subresource)
    probe          measure a candidate model by serving it in a real local replica
"""
