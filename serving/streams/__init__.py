"""Streaming inference: Redis Streams as another front door to an endpoint."""
