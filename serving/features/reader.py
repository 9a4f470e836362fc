"""Online features for a whole micro-batch of entity rows, through the model's FeatureService.

Serving reads the same FeatureService the model was trained with, in one call per batch. A row whose
entity has no features in the online store is refused with the entity named (404), never fed to the
model as NaN.

Two paths give the same frame: by default the store is read directly and the on-demand views run
through Feast's stored transformations (``serving.features.fast_reader``, 3-4x faster for a batch);
where that reader does not know the store's layout, or with ``fast=False``, Feast's
``get_online_features`` does it all.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd
from feast import FeatureStore

from feature_repo import store as feature_store
from serving.features.fast_reader import FastServiceReader, model_frame
from serving.features.store_reader import UnsupportedOnlineStore
from serving.protocol.errors import ApiError, invalid_parameter, not_found, unavailable

log = logging.getLogger(__name__)

_NUMERIC_KINDS = {"Float32": "f", "Float64": "f", "Int32": "i", "Int64": "i"}


@dataclass(frozen=True)
class ServiceLayout:
    """What a FeatureService needs from a request, and what it gives the model."""

    service_name: str
    join_keys: tuple[str, ...]
    request_fields: dict[str, str]
    feature_names: tuple[str, ...]
    view_features: dict[str, tuple[str, ...]]  # batch view -> its features, to spot unknown entities
    view_keys: dict[str, tuple[str, ...]]  # batch view -> its join keys


def layout_for(store: FeatureStore, service_name: str) -> ServiceLayout:
    service = feature_store.feature_service(store, service_name)
    view_features: dict[str, tuple[str, ...]] = {}
    view_keys: dict[str, tuple[str, ...]] = {}
    for projection in service.feature_view_projections:
        try:
            view = store.get_feature_view(projection.name)
        except Exception:
            continue  # on-demand views have no entities
        view_features[projection.name] = tuple(f.name for f in projection.features)
        view_keys[projection.name] = tuple(c.name for c in view.entity_columns)
    return ServiceLayout(
        service_name=service_name,
        join_keys=tuple(feature_store.entity_join_keys(store, service)),
        request_fields=feature_store.request_fields(store, service),
        feature_names=tuple(feature_store.feature_names(service)),
        view_features=view_features,
        view_keys=view_keys,
    )


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    return None


def _as_float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    number = float(value)
    return None if number != number else number  # NaN is not a number a model should see


def check_request_frame(frame: pd.DataFrame, layout: ServiceLayout) -> dict[str, list]:
    """Entity keys and request fields as columns, validated; errors name the column and the row.

    Plain Python over the columns' values: a request is a handful of rows, and pandas' vectorised
    checks cost more than they save at that size.
    """
    missing = [c for c in (*layout.join_keys, *layout.request_fields) if c not in frame.columns]
    if missing:
        raise invalid_parameter(
            f"missing required column(s) for feature service {layout.service_name}: {', '.join(missing)}"
        )
    columns: dict[str, list] = {}
    for key in layout.join_keys:
        values = [_as_int(v) for v in frame[key].tolist()]
        if None in values:
            raise invalid_parameter(f"column {key} must hold integer ids; row {values.index(None)} does not")
        columns[key] = values
    for field, dtype in layout.request_fields.items():
        numbers = [_as_float(v) for v in frame[field].tolist()]
        if None in numbers:
            raise invalid_parameter(f"column {field} must be a number ({dtype}); row {numbers.index(None)} is not")
        present = cast("list[float]", numbers)  # no None: refused above
        columns[field] = [int(n) for n in present] if _NUMERIC_KINDS.get(dtype, "f") == "i" else present
    return columns


class OnlineFeatureReader:
    """Reads a FeatureService's online features for a batch of request rows.

    ``fast`` (the default) reads the online store directly when its layout is one
    ``serving.features.store_reader`` supports; ``self.fast`` says whether it does. Otherwise, and with
    ``fast=False``, every read goes through Feast's ``get_online_features``.
    """

    def __init__(self, store: FeatureStore, service_name: str, fast: bool = True) -> None:
        self._store = store
        self._service = feature_store.feature_service(store, service_name)
        self.layout = layout_for(store, service_name)
        self._fast = self._fast_reader() if fast else None

    @property
    def fast(self) -> bool:
        """Whether reads bypass ``get_online_features``."""
        return self._fast is not None

    def _fast_reader(self) -> FastServiceReader | None:
        try:
            reader = FastServiceReader.build(
                self._store, self._service, self.layout.join_keys, list(self.layout.request_fields)
            )
            log.info("feature service %s: reading the online store directly", self.layout.service_name)
            return reader
        except UnsupportedOnlineStore as exc:
            log.info(
                "feature service %s: reading through Feast's get_online_features (%s)", self.layout.service_name, exc
            )
            return None
        except Exception:  # a bug in the fast path must not take serving down: Feast's path still works
            log.exception(
                "feature service %s: the direct online store reader failed to build; using Feast's",
                self.layout.service_name,
            )
            return None

    @classmethod
    def open(cls, home: Path, service_name: str, fast: bool = True) -> OnlineFeatureReader:
        return cls(feature_store.open_store(home), service_name, fast=fast)

    def read(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The model's input frame: one row per request row, columns in the service's order."""
        columns = check_request_frame(frame, self.layout)
        if self._fast is not None:
            return self._read_fast(self._fast, columns)
        try:
            response = self._store.get_online_features(features=self._service, entity_rows=columns).to_dict()
        except ApiError:
            raise
        except Exception as exc:
            log.exception("online store read failed for feature service %s", self.layout.service_name)
            raise unavailable("the online feature store is unavailable") from exc
        self._refuse_unknown(response, columns)
        return pd.DataFrame({name: response[name] for name in self.layout.feature_names})

    def _read_fast(self, fast: FastServiceReader, columns: dict[str, list]) -> pd.DataFrame:
        # The same errors as Feast's path: the store or a transform failing is a 503, an unknown
        # entity a 404 (checked before the transforms: they never run on rows that are refused).
        try:
            response = fast.read_batch(columns)
        except Exception as exc:
            log.exception("online store read failed for feature service %s", self.layout.service_name)
            raise unavailable("the online feature store is unavailable") from exc
        self._refuse_unknown(response, columns)
        try:
            fast.apply_on_demand(response, columns)
        except Exception as exc:
            log.exception("on-demand transform failed for feature service %s", self.layout.service_name)
            raise unavailable("the online feature store is unavailable") from exc
        return model_frame(response, self.layout.feature_names)

    def _refuse_unknown(self, response: dict[str, list], columns: dict[str, list]) -> None:
        for view, names in self.layout.view_features.items():
            if not names:
                continue
            missing = np.all([[v is None for v in response[n]] for n in names], axis=0)
            if missing.any():
                row = int(np.argmax(missing))
                keys = ", ".join(self.layout.view_keys[view])
                raise not_found(f"unknown entity: no {view} features for {keys} at row {row}")
