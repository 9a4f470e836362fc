"""A FeatureService's online features without ``get_online_features``: the store read directly, then
the service's on-demand views run through Feast's own stored transformations.

Why: see ``serving.features.store_reader``; this module adds what Feast does around the store read for a
FeatureService. The on-demand views are the registered ``OnDemandFeatureView`` objects, called through
``transform_dict`` (what Feast calls in python mode) with the columns Feast hands them: the join keys,
the request fields and the features of the views the on-demand view declares as sources. Their
outputs are typed as Feast types them. There is one definition of every transform, and no skew.

Anything this does not reproduce exactly (aliased or re-keyed projections, pandas or substrait mode,
on-demand views written to the store or with aggregations) raises ``UnsupportedOnlineStore`` when it
is built, so the caller stays on Feast's path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from feast import FeatureService, FeatureStore, FeatureView
from feast.on_demand_feature_view import OnDemandFeatureView
from feast.type_map import feast_value_type_to_python_type, python_values_to_proto_values
from feast.value_type import ValueType

from serving.features.store_reader import (
    OnlineStoreReader,
    UnsupportedOnlineStore,
    ViewSpec,
    check_supported,
    open_online_store_reader,
)

_INT64_RANGE = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class OnDemandStep:
    """One on-demand view of the service: what Feast feeds its transform, and what the service keeps."""

    view: OnDemandFeatureView
    inputs: tuple[str, ...]
    outputs: tuple[tuple[str, ValueType], ...]


def _projection_name(projection: Any) -> str:
    if projection.name_alias or projection.join_key_map:
        raise UnsupportedOnlineStore(f"projection of {projection.name} is aliased or re-keyed; not supported")
    return projection.name


def _want(wanted: dict[str, list[str]], view: str, features: Sequence[str]) -> None:
    names = wanted.setdefault(view, [])
    names.extend(f for f in features if f not in names)


def _on_demand_view(store: FeatureStore, name: str) -> OnDemandFeatureView | None:
    try:
        return store.get_on_demand_feature_view(name, allow_registry_cache=True)
    except Exception:
        return None


def _batch_view(store: FeatureStore, name: str) -> FeatureView:
    try:
        return store.get_feature_view(name, allow_registry_cache=True)
    except Exception as exc:  # a stream view, say: Feast's path knows it, this reader does not
        raise UnsupportedOnlineStore(f"{name} is not a batch feature view this reader can read") from exc


def _check_on_demand(odfv: OnDemandFeatureView) -> None:
    if odfv.mode != "python":
        raise UnsupportedOnlineStore(f"on-demand view {odfv.name} is in {odfv.mode} mode; only python is read directly")
    if odfv.write_to_online_store or odfv.aggregations:
        raise UnsupportedOnlineStore(f"on-demand view {odfv.name} is stored or aggregated; not supported")
    if odfv.feature_transformation is None:
        raise UnsupportedOnlineStore(f"on-demand view {odfv.name} has no transformation")


class FastServiceReader:
    """Reads one FeatureService's features the way ``get_online_features(features=service)`` does."""

    def __init__(
        self,
        store_reader: OnlineStoreReader,
        steps: Sequence[OnDemandStep],
        join_keys: Sequence[str],
        request_fields: Sequence[str],
    ) -> None:
        self.store_reader = store_reader
        self.steps = tuple(steps)
        self._prefix = (*join_keys, *request_fields)

    @classmethod
    def build(
        cls, store: FeatureStore, service: FeatureService, join_keys: Sequence[str], request_fields: Sequence[str]
    ) -> FastServiceReader:
        """The reader for ``service`` on ``store``'s online store; ``UnsupportedOnlineStore`` if it cannot be."""
        check_supported(store.config)  # before touching the registry: the cheap, common refusal
        wanted: dict[str, list[str]] = {}  # every batch view read, with its features, in Feast's order
        service_features: dict[str, tuple[str, ...]] = {}
        odfvs: list[tuple[OnDemandFeatureView, tuple[str, ...]]] = []
        for projection in service.feature_view_projections:
            name = _projection_name(projection)
            names = tuple(f.name for f in projection.features)
            odfv = _on_demand_view(store, name)
            if odfv is None:
                service_features[name] = names
                _want(wanted, name, names)
            else:
                _check_on_demand(odfv)
                odfvs.append((odfv, names))
        for odfv, _ in odfvs:  # Feast also reads the features each on-demand view takes from its sources
            for source in odfv.source_feature_view_projections.values():
                _want(wanted, _projection_name(source), [f.name for f in source.features])
        views = [ViewSpec.of(_batch_view(store, name), features) for name, features in wanted.items()]
        all_features = [f for view in views for f in view.features]
        if len(set(all_features)) != len(all_features):
            raise UnsupportedOnlineStore("two feature views share a feature name; Feast would need full feature names")
        for view in views:
            if not set(view.join_keys) <= set(join_keys):
                raise UnsupportedOnlineStore(f"feature view {view.name} needs join keys outside the service's")
        reader = open_online_store_reader(store.config, views)
        extras = reader.empty_response_columns
        steps = [
            cls._step(odfv, names, views, service_features, odfvs, [*join_keys, *request_fields], extras)
            for odfv, names in odfvs
        ]
        return cls(reader, steps, join_keys, request_fields)

    @staticmethod
    def _step(
        odfv: OnDemandFeatureView,
        names: tuple[str, ...],
        views: list[ViewSpec],
        service_features: dict[str, tuple[str, ...]],
        odfvs: list[tuple[OnDemandFeatureView, tuple[str, ...]]],
        request_columns: Sequence[str],
        extras: Sequence[str],
    ) -> OnDemandStep:
        # feast.utils._augment_response_with_on_demand_transforms: a UDF sees join keys, request data
        # and features, minus those of views it did not declare as sources (#6158)
        declared = {p.name for p in odfv.source_feature_view_projections.values()}
        hidden: set[str] = set()
        for view, features in service_features.items():
            if view not in declared:
                hidden.update(features)
        for other, _ in odfvs:
            for projection in other.source_feature_view_projections.values():
                if projection.name not in declared:
                    hidden.update(f.name for f in projection.features)
        read = [f for view in views for f in view.features]
        inputs = [c for c in dict.fromkeys((*request_columns, *read, *extras)) if c not in hidden]
        types = {f.name: f.dtype.to_value_type() for f in odfv.features}
        return OnDemandStep(odfv, tuple(inputs), tuple((n, types.get(n, ValueType.UNKNOWN)) for n in names))

    def read_batch(self, columns: dict[str, list]) -> dict[str, list]:
        """The batch views' features (as ``to_dict()`` names them) for the request ``columns``."""
        response: dict[str, list] = {}
        for rows in self.store_reader.read(columns).values():
            response.update(rows.values)
        return response

    def apply_on_demand(self, response: dict[str, list], columns: dict[str, list]) -> None:
        """Run each on-demand view on the batch, adding the features the service asks of it."""
        known = {**response, **{c: columns[c] for c in self._prefix}}
        rows = len(columns[self._prefix[0]]) if self._prefix else 0
        known.update({c: [None] * rows for c in self.store_reader.empty_response_columns})
        for step in self.steps:
            produced = step.view.transform_dict({name: known[name] for name in step.inputs})
            for name, value_type in step.outputs:
                if name in produced:
                    response[name] = as_feast_returns(produced[name], value_type)

    def close(self) -> None:
        self.store_reader.close()


def as_feast_returns(values: Any, value_type: ValueType) -> list[Any]:
    """A transform's output column as Feast returns it: through its Value proto and back.

    Finite-or-infinite Python floats for a DOUBLE and in-range Python ints for an INT64 come back
    unchanged, so that round trip is skipped for them (it costs ~2 µs a value); anything else (NaN,
    numpy scalars, Float32 rounding, None) takes Feast's conversion.
    """
    values = values if isinstance(values, list) else [values]
    if value_type == ValueType.DOUBLE and all(type(v) is float and v == v for v in values):
        return list(values)
    low, high = _INT64_RANGE
    if value_type == ValueType.INT64 and all(type(v) is int and low <= v <= high for v in values):
        return list(values)
    return [feast_value_type_to_python_type(p, value_type) for p in python_values_to_proto_values(values, value_type)]


def model_frame(response: dict[str, list], names: Sequence[str]) -> pd.DataFrame:
    """``pd.DataFrame({name: response[name]})``, built from typed arrays: the same frame at ~1/3 the cost.

    A column of Python floats (with or without None) becomes float64 and one of Python ints int64,
    exactly as pandas infers them from the lists; anything else is left to pandas.
    """
    data: dict[str, Any] = {}
    for name in names:
        values = response[name]
        kinds = set(map(type, values))
        if kinds == {float} or kinds == {float, type(None)}:
            data[name] = np.array(values, dtype=np.float64)
        elif kinds == {int}:
            try:
                data[name] = np.array(values, dtype=np.int64)
            except OverflowError:
                data[name] = values
        else:
            data[name] = values
    return pd.DataFrame(data, copy=False)
