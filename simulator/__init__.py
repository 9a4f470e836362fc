"""Discrete-event simulator of the autoscaler against traces, model profiles and baselines.

``python -m simulator --help``; the pieces: :mod:`.traces`, :mod:`.profiles`,
:mod:`.engine` (the step loop; what policies see and runs return in :mod:`.interface`, the servers in
:mod:`.pool`, the requests in :mod:`.queueing`, the per-second samples in :mod:`.seconds`, replica
starts in :mod:`.starts`), :mod:`.baselines`, :mod:`.policies`.
"""
