"""Serving endpoints: what a user asks for and how it comes to serve.

spec                 the Databricks-compatible request, config and record types
validation           a config checked and its defaults filled in (entities, traffic, kept extension blocks)
scaling              a served entity's autoscaler settings
views                a record as Databricks returns it
monitoring_settings  the config's ``monitoring`` block and the drift and canary settings
external             external models' config (a model another server runs)
store                endpoint records in SQLite or PostgreSQL (compare-and-set on the config version)
api                  the API's operations on records: create, update, delete, get, list
resolver             an alias or version resolved to a registry version
rollouts             a config brought live on replica sets; what serves each endpoint now (``live``)
placement            where a served entity's replicas run: local processes or Kubernetes pods
reconcile            restore at start, and the leader's and followers' refresh across gateways
ai_gateways          each endpoint's AI gateway and its external models' secrets
manager              one gateway's endpoints: the parts above built over one store and launcher
openapi              an endpoint's OpenAPI document, from its models' signatures
"""
