"""tollfree's client for a service in several regions: health-checked failover with a retry budget.

It needs only httpx: install tollfree (or copy this package) and import it without the rest of the stack.
"""

from tollfree_client.budget import RetryBudget
from tollfree_client.failover import AllRegionsFailed, FailoverClient

__all__ = ["AllRegionsFailed", "FailoverClient", "RetryBudget"]
