"""Opening the feature store and registering the repository's definitions.

The repository's objects are listed here explicitly (no module scanning), so the Python API, the
flows and the replicas all register and read exactly the same definitions.
"""

from __future__ import annotations

import os
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import yaml
from feast import Entity, FeatureService, FeatureStore, FeatureView, RepoConfig

from feature_repo.data_sources import (
    CUSTOMER_ACTIVITY_PATH,
    MERCHANT_RISK_PATH,
    customer_activity_source,
    merchant_risk_source,
    transaction_request,
)
from feature_repo.entities import customer, merchant
from feature_repo.feature_services import fraud_v1
from feature_repo.features import customer_activity, merchant_risk
from feature_repo.on_demand_features import transaction_context
from feature_repo.synthetic import write_parquet_atomic

REPO_DIR = Path(__file__).resolve().parent
CONFIG_FILE = REPO_DIR / "feature_store.yaml"
CONFIG_FILES = {"sqlite": CONFIG_FILE, "redis": REPO_DIR / "feature_store.redis.yaml"}
TABLE_PATHS = {"customer_activity": CUSTOMER_ACTIVITY_PATH, "merchant_risk": MERCHANT_RISK_PATH}
# Feature tables are stored sorted by entity key, then time, in row groups of this many rows: each row
# group then covers a narrow key range, and DuckDB skips the row groups outside the keys a point-in-time
# join asks for (their min/max statistics), instead of reading the whole table for every call.
TABLE_ROW_GROUP_ROWS = 65_536
DEFINITIONS: list[Any] = [
    customer,
    merchant,
    customer_activity_source,
    merchant_risk_source,
    transaction_request,
    customer_activity,
    merchant_risk,
    transaction_context,
    fraud_v1,
]


@dataclass(frozen=True)
class OnlineStoreChoice:
    """Which online store the repository uses: ``sqlite`` (embedded) or ``redis`` (at scale)."""

    kind: str = "sqlite"
    redis: str | None = None  # Redis connection string, host:port[,db=N,password=...]

    def __post_init__(self) -> None:
        if self.kind not in CONFIG_FILES:
            raise ValueError(f"online store must be one of {', '.join(CONFIG_FILES)}, got {self.kind!r}")
        if self.kind == "redis" and not self.redis:
            raise ValueError("the redis online store needs a connection string (TOLLFREE_REDIS)")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> OnlineStoreChoice:
        return cls(environ.get("TOLLFREE_ONLINE_STORE", "sqlite"), environ.get("TOLLFREE_REDIS"))


def load_config(home: Path, choice: OnlineStoreChoice = OnlineStoreChoice()) -> RepoConfig:
    """Read the repository's yaml for ``choice`` with its variables substituted; paths resolve in ``home``."""
    values = {"TOLLFREE_HOME": str(home), "TOLLFREE_REDIS": choice.redis or ""}
    text = string.Template(CONFIG_FILES[choice.kind].read_text()).substitute(values)
    config = RepoConfig(**yaml.safe_load(text))
    config.repo_path = home
    return config


def open_store(home: Path, choice: OnlineStoreChoice | None = None) -> FeatureStore:
    """The feature store whose registry and tables live in the state folder ``home``.

    The online store comes from ``choice``, by default from ``TOLLFREE_ONLINE_STORE`` / ``TOLLFREE_REDIS``.
    """
    home = Path(home).resolve()
    (home / "feast").mkdir(parents=True, exist_ok=True)
    choice = choice or OnlineStoreChoice.from_environ(os.environ)
    return FeatureStore(config=load_config(home, choice), repo_path=str(home))


def bind_sources(home: Path) -> None:
    """Point the file sources at the tables in ``home``.

    Feast's DuckDB store reads a relative source path from the working directory, not the repo path,
    so the registry must hold absolute paths; they are bound here, once, when definitions are applied.
    """
    for source, relative in (
        (customer_activity_source, CUSTOMER_ACTIVITY_PATH),
        (merchant_risk_source, MERCHANT_RISK_PATH),
    ):
        source.file_options.uri = str(Path(home).resolve() / relative)


def check_sources(home: Path) -> None:
    """Every batch view's columns exist in its table, before anything is registered; errors name both."""
    for view in (d for d in DEFINITIONS if isinstance(d, FeatureView)):
        relative = TABLE_PATHS[view.name]
        path = Path(home) / relative
        if not path.exists():
            raise FileNotFoundError(
                f"feature view {view.name} reads {path}, which does not exist: run the materialize flow"
            )
        columns = set(pq.read_schema(path).names)
        wanted = [*table_order(view.name), *(f.name for f in view.features)]
        missing = [c for c in wanted if c not in columns]
        if missing:
            raise ValueError(
                f"feature view {view.name} references column(s) missing from {relative}: {', '.join(missing)}"
            )


def apply_definitions(store: FeatureStore) -> list[str]:
    """Check the tables, then register every definition of the repository (idempotent); returns their names."""
    home = Path(store.repo_path)
    check_sources(home)
    bind_sources(home)
    store.apply(DEFINITIONS)
    return [obj.name for obj in DEFINITIONS]


def write_table(home: Path, name: str, frame: pd.DataFrame) -> Path:
    """Write a feature table atomically (a reader sees the old file or the new one, never half), sorted
    by its view's entity keys and then its timestamp, in row groups of ``TABLE_ROW_GROUP_ROWS``."""
    target = Path(home) / TABLE_PATHS[name]
    target.parent.mkdir(parents=True, exist_ok=True)
    order = [c for c in table_order(name) if c in frame.columns]
    ordered = frame.sort_values(order, kind="stable", ignore_index=True) if order else frame
    write_parquet_atomic(ordered, target, row_group_size=TABLE_ROW_GROUP_ROWS)
    return target


def table_order(name: str) -> list[str]:
    """The columns a feature table is stored sorted by: its view's join keys, then its timestamp field."""
    view = next((d for d in DEFINITIONS if isinstance(d, FeatureView) and d.name == name), None)
    if view is None:
        raise KeyError(f"no feature view named {name!r} (known: {', '.join(TABLE_PATHS)})")
    keys = [e.join_key for e in DEFINITIONS if isinstance(e, Entity) and e.name in view.entities]
    return [*keys, view.batch_source.timestamp_field]


def feature_service(store: FeatureStore, name: str) -> FeatureService:
    """The registered FeatureService ``name``, with a clear error if it is not registered."""
    try:
        return store.get_feature_service(name)
    except Exception as exc:  # Feast raises its own FeatureServiceNotFoundException
        raise LookupError(f"feature service {name!r} is not registered in the feature store") from exc


def feature_names(service: FeatureService) -> list[str]:
    """The service's feature names, in the order the model sees its columns."""
    return [f.name for projection in service.feature_view_projections for f in projection.features]


def entity_join_keys(store: FeatureStore, service: FeatureService) -> list[str]:
    """Join keys of the entities the service's batch views need, in first-seen order."""
    keys: list[str] = []
    for projection in service.feature_view_projections:
        try:
            view = store.get_feature_view(projection.name)
        except Exception:
            continue  # on-demand views have no entities of their own
        for column in view.entity_columns:
            if column.name not in keys:
                keys.append(column.name)
    return keys


def request_fields(store: FeatureStore, service: FeatureService) -> dict[str, str]:
    """Request-time fields the service's on-demand views need: name -> Feast type name."""
    fields: dict[str, str] = {}
    for projection in service.feature_view_projections:
        try:
            odfv = store.get_on_demand_feature_view(projection.name)
        except Exception:
            continue
        for source in odfv.source_request_sources.values():
            for field in source.schema:
                fields[field.name] = str(field.dtype)
    return fields


def service_views(store: FeatureStore, service: FeatureService) -> list[dict[str, Any]]:
    """The service's views as a device needs to know them: each view's kind, its features and what it reads.

    A ``batch`` view's values come from the online store (a device must be sent them); an ``on_demand`` view is
    computed from ``request`` fields and the ``views`` it names, so it can be computed where the request is when
    it names no view."""
    out: list[dict[str, Any]] = []
    for projection in service.feature_view_projections:
        features = [f.name for f in projection.features]
        try:
            odfv = store.get_on_demand_feature_view(projection.name)
        except Exception:  # Feast raises its own not-found error: a batch view
            out.append({"name": projection.name, "kind": "batch", "features": features})
            continue
        request = [f.name for source in odfv.source_request_sources.values() for f in source.schema]
        views = sorted(odfv.source_feature_view_projections)
        out.append(
            {"name": projection.name, "kind": "on_demand", "features": features, "request": request, "views": views}
        )
    return out
