"""Point-in-time retrieval of a FeatureService for many rows, with its on-demand views fed only their inputs.

``store.get_historical_features(entity_df, features=service).to_arrow()`` joins the batch views and then
runs each on-demand view's transform on the *whole* joined table. A python-mode view converts that
table to Python lists first (``to_pydict``), so every column it never reads -- the entity keys, the
row key, the UTC ``event_timestamp`` above all, the other views' features -- is turned into Python
objects and dropped again: about half the join time of a 200k-row chunk (CHANGELOG, benchmarks history).

``historical_features`` gives the same table. The batch views are joined by Feast
(``get_historical_features`` with their ``view:feature`` references, the service's projections), and
each on-demand view of the service runs through Feast's own ``OnDemandFeatureView.transform_arrow``,
the code Feast runs, on the columns the view declares as its sources (its source views' features and
its request fields) instead of on all of them. The transform's definition stays the one in
``on_demand_features``, shared with training and serving.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import pyarrow as pa


@dataclass(frozen=True)
class JoinedViews:
    """The batch views joined point in time (a pyarrow table), and the on-demand views still to run on it."""

    table: pa.Table
    on_demand: tuple[Any, ...]
    full_feature_names: bool


def historical_features(
    store: Any, service: Any, entity_df: pd.DataFrame, full_feature_names: bool = False
) -> pd.DataFrame:
    """The service's features for every row of ``entity_df``, point in time: what
    ``store.get_historical_features(entity_df=entity_df, features=service).to_df()`` returns, with the same
    columns and values (row order is Feast's in both)."""
    return with_on_demand_features(join_batch_views(store, service, entity_df, full_feature_names))


def join_batch_views(
    store: Any, service: Any, entity_df: pd.DataFrame, full_feature_names: bool = False
) -> JoinedViews:
    """The first half of ``historical_features``: Feast's point-in-time join of the service's batch views (and its
    on-demand views' source views) -- the half that uses the offline store's connection."""
    refs, on_demand = _split(store, service)
    # without on-demand views Feast's own path runs nothing more (``to_df`` is ``to_arrow().to_pandas()``)
    table = store.get_historical_features(
        entity_df=entity_df, features=refs if on_demand else service, full_feature_names=full_feature_names
    ).to_arrow()
    return JoinedViews(table, tuple(on_demand), full_feature_names)


def with_on_demand_features(joined: JoinedViews) -> pd.DataFrame:
    """The second half: each on-demand view run through Feast's ``transform_arrow`` on its declared inputs, its
    features appended; no store access (it can run while the store joins the next rows)."""
    table = joined.table
    for view in joined.on_demand:
        inputs = _inputs(view, table.column_names)
        out = view.transform_arrow(table.select(inputs), joined.full_feature_names)
        for name in _outputs(view, joined.full_feature_names):
            if name not in out.column_names:
                raise RuntimeError(f"on-demand feature view {view.name!r} did not return its feature {name!r}")
            table = table.append_column(name, out[name])
    return table.to_pandas().reset_index(drop=True)


def _split(store: Any, service: Any) -> tuple[list[str], list[Any]]:
    """The batch-view references (``view:feature``) to join -- the service's, and its on-demand views'
    source views -- and the on-demand views, projected as the service asks (the ``with_projection`` Feast
    applies)."""
    refs: list[str] = []
    on_demand: list[Any] = []
    odfv_names = {view.name for view in store.list_on_demand_feature_views()}
    for projection in service.feature_view_projections:
        if projection.name in odfv_names:
            on_demand.append(store.get_on_demand_feature_view(projection.name).with_projection(projection))
        else:
            refs.extend(f"{projection.name_to_use()}:{feature.name}" for feature in projection.features)
    # an on-demand view's source views are joined whole, as Feast joins them (and returns them) too
    for view in on_demand:
        for source in view.source_feature_view_projections.values():
            refs.extend(
                ref for feature in source.features if (ref := f"{source.name_to_use()}:{feature.name}") not in refs
            )
    return refs, on_demand


def _inputs(view: Any, columns: list[str]) -> list[str]:
    """The joined table's columns an on-demand view reads: its source views' features (by their short or
    their full name, whichever the table has: Feast's preprocessing adds the other) and its request fields."""
    present = set(columns)
    wanted: list[str] = []
    for source in view.source_feature_view_projections.values():
        for feature in source.features:
            for name in (feature.name, f"{source.name}__{feature.name}"):
                if name in present and name not in wanted:
                    wanted.append(name)
    for request in view.source_request_sources.values():
        for field in request.schema:
            if field.name not in present:
                raise ValueError(
                    f"on-demand feature view {view.name!r} needs the request field {field.name!r}, "
                    "which the entity rows do not have"
                )
            if field.name not in wanted:
                wanted.append(field.name)
    return wanted


def _outputs(view: Any, full_feature_names: bool) -> list[str]:
    """The names of the view's projected features in the result, as Feast names them."""
    prefix = f"{view.projection.name_to_use()}__" if full_feature_names else ""
    return [prefix + feature.name for feature in view.projection.features]
