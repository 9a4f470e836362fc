"""One flow per endpoint, for every endpoint: the scheduled monitoring deployments run this way.

``for_each_endpoint`` runs a per-endpoint flow as a subflow for each endpoint, one after another (each
reads and writes little; together they would only contend for the same cores), keeping each one's final
state: a failed endpoint is reported and the next one still runs. The parent leaves a table artifact
with every endpoint's outcome and a ``tollfree.<name>.all`` event; ``raise_for`` ends it Failed, naming
the endpoints, when any endpoint's run failed (or, for the caller to say, found something).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.events import emit_event


def artifact_key(text: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


def _short(value: Any) -> str:
    if isinstance(value, dict):
        if value.get("findings"):
            return "findings: " + ", ".join(map(str, value["findings"][:20]))
        for key in ("verdict", "action"):
            if key in value:
                return str(value[key])
    return str(value)[:200]


def for_each_endpoint(
    name: str, per_endpoint: Callable[..., Any], endpoints: list[str], **kwargs: Any
) -> dict[str, Any]:
    """Run ``per_endpoint(endpoint=...)`` for each of ``endpoints``; {endpoint: its result, or {"error": why}}."""
    logger = get_run_logger()
    results: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for endpoint in endpoints:
        state = per_endpoint(endpoint=endpoint, return_state=True, **kwargs)
        if state.is_completed():
            results[endpoint] = state.result()
        else:
            try:
                state.result()
                reason = state.message or state.name
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}"
            failed[endpoint] = reason[:500]
            results[endpoint] = {"error": failed[endpoint]}
            logger.warning("%s on %s failed: %s", name, endpoint, failed[endpoint])
    rows: list[dict[str, str | None]] = [
        {
            "endpoint": e,
            "outcome": "failed" if e in failed else "completed",
            "result": failed.get(e) or _short(results[e]),
        }
        for e in endpoints
    ]
    create_table_artifact(
        key=artifact_key(f"{name}-all"),
        table=rows or [{"endpoint": None, "outcome": "no endpoint"}],
        description=f"{name} on {len(endpoints)} endpoint(s): {len(failed)} failed",
    )
    emit_event(
        event=f"tollfree.{name}.all",
        resource={"prefect.resource.id": f"tollfree.{name}"},
        payload={"endpoints": endpoints, "failed": sorted(failed)},
    )
    logger.info("%s on %d endpoint(s): %s", name, len(endpoints), {r["endpoint"]: r["result"] for r in rows})
    return results


def raise_for(name: str, results: dict[str, Any], found: Callable[[Any], bool] = lambda result: False) -> None:
    """Fail the parent run when an endpoint's run failed or ``found`` something in its result, naming them."""
    failed = {e: r["error"] for e, r in results.items() if isinstance(r, dict) and "error" in r}
    findings = [e for e, r in results.items() if e not in failed and found(r)]
    if failed or findings:
        parts = [f"{e}: failed: {r}" for e, r in failed.items()] + [f"{e}: {_short(results[e])}" for e in findings]
        raise RuntimeError(f"{name} on {len(results)} endpoint(s): " + "; ".join(parts))
