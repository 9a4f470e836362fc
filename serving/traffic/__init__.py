"""Where a request goes once it is admitted: the served entity, the queue, the replica, the batch.

replica         ``Replica``: what the gateway uses of a replica, local, remote or a pod, and its id
router          the traffic split (weighted, seeded) and the least-outstanding replica
dispatcher      per served entity: admission, the bounded queue, micro-batches to replicas
load_meter      time-averaged in flight and queued, arrivals, completions, latency
response_cache  the exact-match cache keyed on the canonical payload and the served version
batching        whether a model gains from batching: the plan a replica measures, the dispatcher follows
"""
