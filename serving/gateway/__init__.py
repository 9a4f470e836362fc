"""The gateway process: the serving-endpoints API (control plane) and invocations (data plane).

app            the ASGI app: token check before FastAPI, its start and stop, the public-port view
control_plane  the serving-endpoints API's routes, the replicas and autoscaler views, /metrics
data_plane     invocations: auth, size, traffic split, response cache, dispatch, inference log record
auth           bearer tokens and their rights (admin, per endpoint)
rate_limit     per-token token buckets (429 with Retry-After)
metrics        the gateway's Prometheus registry
autoscaling    the autoscaler stepped inside the gateway: signals from the dispatchers and replicas
process        run the gateway as a child process (``python -m serving``) and wait for it
"""
