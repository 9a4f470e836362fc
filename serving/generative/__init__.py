"""Generative endpoints: chat requests, the AI gateway's limits and usage, payload redaction."""
