"""The model lifecycle in the registry: aliases ``candidate`` -> ``challenger`` -> ``champion``, with
``previous`` kept for one-step rollback.

Each alias move is one registry update, and they are ordered so that a crash between two of them
leaves a consistent registry: ``champion`` always names a version, ``previous`` is written before
``champion`` moves, and re-running a move completes it (every step is idempotent).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING

from serving.registry.gates import GateResult
from serving.registry.versions import aliases

if TYPE_CHECKING:
    from mlflow import MlflowClient

CANDIDATE = "candidate"
CHALLENGER = "challenger"
CHAMPION = "champion"
PREVIOUS = "previous"
ROLLED_BACK = "rolled_back"

Step = Callable[[str], None]


def _noop(_: str) -> None:
    return None


def _record(client: MlflowClient, model: str, version: str, prefix: str, who: str, why: str, now: datetime) -> None:
    client.set_model_version_tag(model, version, f"{prefix}.at", now.isoformat())
    client.set_model_version_tag(model, version, f"{prefix}.by", who)
    client.set_model_version_tag(model, version, f"{prefix}.reason", why[:4000])


def drop(client: MlflowClient, model: str, alias: str, version: str) -> None:
    """Remove ``alias`` if it still names ``version`` (another version may hold it by now)."""
    if aliases(client, model).get(alias) == version:
        client.delete_registered_model_alias(model, alias)


def make_challenger(client: MlflowClient, model: str, version: str) -> None:
    client.set_registered_model_alias(model, CHALLENGER, version)
    drop(client, model, CANDIDATE, version)


def make_champion(
    client: MlflowClient, model: str, version: str, *, who: str, why: str, now: datetime, after_step: Step = _noop
) -> str | None:
    """Move ``champion`` to ``version``; the old champion becomes ``previous``. Returns the old one."""
    current = aliases(client, model).get(CHAMPION)
    if current == version:
        return None
    if current is not None:
        client.set_registered_model_alias(model, PREVIOUS, current)
        after_step("previous")
    client.set_registered_model_alias(model, CHAMPION, version)
    after_step("champion")
    _record(client, model, version, "champion.promoted", who, why, now)
    for alias in (CHALLENGER, CANDIDATE):
        drop(client, model, alias, version)
    return current


def record_gates(
    client: MlflowClient, model: str, version: str, results: Iterable[GateResult], policy: str, now: datetime
) -> None:
    """Each gate's result on the version as tags (``gate.NAME`` pass/fail, its value, threshold and reason),
    with the policy file's name and the time."""
    for r in results:
        client.set_model_version_tag(model, version, f"gate.{r.gate}", "pass" if r.passed else "fail")
        client.set_model_version_tag(model, version, f"gate.{r.gate}.value", r.value[:4000])
        client.set_model_version_tag(model, version, f"gate.{r.gate}.threshold", r.threshold[:1000])
        client.set_model_version_tag(model, version, f"gate.{r.gate}.reason", r.reason[:1000])
    client.set_model_version_tag(model, version, "promotion.policy", policy)
    client.set_model_version_tag(model, version, "promotion.evaluated_at", now.isoformat())


def admit(client: MlflowClient, model: str, version: str, *, bootstrap: bool, who: str, now: datetime) -> str:
    """A version that passed every gate becomes ``challenger``, or ``champion`` when the model has none yet
    and its policy allows that (``bootstrap``); the alias it now holds."""
    if bootstrap and CHAMPION not in aliases(client, model):
        make_champion(client, model, version, who=who, why="first version to pass every gate", now=now)
        return CHAMPION
    make_challenger(client, model, version)
    return CHALLENGER


def rollback(
    client: MlflowClient, model: str, *, who: str, why: str, now: datetime, after_step: Step = _noop
) -> tuple[str, str]:
    """Move ``champion`` back to ``previous`` in one update; returns (from version, to version)."""
    held = aliases(client, model)
    target, current = held.get(PREVIOUS), held.get(CHAMPION)
    if target is None:
        raise LookupError(f"registered model {model!r} has no {PREVIOUS!r} version to roll back to")
    if current is None:
        raise LookupError(f"registered model {model!r} has no {CHAMPION!r} to roll back from")
    if current == target:  # a rollback that crashed after its move: finish it
        client.delete_registered_model_alias(model, PREVIOUS)
        return current, target
    client.set_registered_model_alias(model, CHAMPION, target)
    after_step("champion")
    _record(client, model, current, "rollback.from", who, why, now)
    _record(client, model, target, "rollback.to", who, why, now)
    client.set_registered_model_alias(model, ROLLED_BACK, current)
    client.delete_registered_model_alias(model, PREVIOUS)
    return current, target
