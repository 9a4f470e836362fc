"""Serving endpoints: what a user asks for and how it comes to serve.

spec      the Databricks-compatible request and record types, validation, traffic weights
store     endpoint records in SQLite (compare-and-set on the config version)
manager   the control plane's live state: rollouts that start replicas, then move traffic
openapi   an endpoint's OpenAPI document, from its models' signatures
"""
