"""Discrete-event simulator of the autoscaler against traces, model profiles and baselines.

``python -m serving.autoscaler.simulate --help``; the pieces: :mod:`.traces`, :mod:`.profiles`,
:mod:`.engine`, :mod:`.baselines`, :mod:`.policies`.
"""
