"""Backends apply a replica count (see :class:`serving.autoscaler.controller.Backend`)."""
