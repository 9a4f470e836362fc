"""Replicas as Kubernetes pods (``TOLLFREE_BACKEND=kubernetes``): one Deployment per served entity.

objects   the entity's Deployment, headless Service and PodDisruptionBudget, from the replica template
api       the leader's calls: create (or adopt), scale, delete, list what the gateways manage
routes    every gateway's routing: ready pod addresses from an EndpointSlice watch
pod_set   ``PodSet``: the ``ReplicaSet`` of an entity whose replicas are pods
connect   the settings from the environment, the client's credentials, one ``Cluster`` per gateway
"""
