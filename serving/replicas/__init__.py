"""The gateway's side of its replicas: start, stop, reach and measure them.

replica_set    ``ReplicaSet``: one served entity's replicas and limits, and the only code that changes them
local          replicas as local OS processes (``python -m serving.replica_server``): start, ready, stop
local_backend  starts and stops local processes for the replica sets (warm pool first)
forking        the gateway's fork server, which local replica processes are forked from
warm_pool      standby processes with the runtime imported, waiting for a model
client         the keep-alive client that sends batch envelopes to a replica (and returns its readings)
remote         a replica another gateway runs (several gateways on one machine)
book           local replicas recorded in the state store's replica table, adopted after a crash
cluster/       replicas as Kubernetes pods: a Deployment per entity, routing from EndpointSlices
probe          measure a candidate model by serving it in a real local replica
"""
