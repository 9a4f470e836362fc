"""What a replica process imports before its model, and what it does before its first import of Feast.

Feast wraps its definition classes (``FeatureView``, ``FeatureService``, data sources, entities...) in
typeguard's ``@typechecked``, which re-reads and recompiles each wrapped class's source when Feast is
imported: about 3-4 of the 7-9 CPU-seconds a replica spent on imports (measured on a 2-core machine in
three alternating runs: 8.8, 6.9, 7.1 -> 4.4, 4.3, 4.3 user-seconds). A replica never builds definitions: it
reads them from the Feast registry, already checked when ``feast apply`` (``flows.materialize``) wrote them. So
it makes ``typechecked`` the no-op typeguard itself makes it under ``python -O``, which is typeguard's
documented way of running without these checks. Every other process (flows, tests, ``feast apply``)
keeps them.
"""

from __future__ import annotations

import sys
from typing import Any


def _unchecked(target: Any = None, **_options: Any) -> Any:
    return (lambda wrapped: wrapped) if target is None else target


def skip_feast_type_checks() -> bool:
    """Turn ``typeguard.typechecked`` into a no-op for the Feast imported after this; False (nothing
    done) when Feast is already imported, since its classes are then instrumented already."""
    if "feast" in sys.modules:
        return False
    import typeguard

    typeguard.typechecked = _unchecked
    return True


def import_runtime() -> None:
    """Import what loading a model will need (seconds of a replica's start): a standby does it before it
    waits for a model, the fork server (``serving.replica_server.fork_server``) before it forks replicas.
    Imports only: no connection or file is opened and no thread of ours started, so a process that forks
    afterwards hands its children no live connection (the native libraries' own threads, OpenBLAS's and
    pyarrow's jemalloc's, come with fork handlers). Call ``skip_feast_type_checks`` first."""
    import mlflow.pyfunc
    import mlflow.sklearn
    import mlflow.store.model_registry.sqlalchemy_store
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401  (imported for its import time, as all here)
    import sklearn.ensemble  # noqa: F401  (imported for its import time)
    import skops.io  # noqa: F401  (imported for its import time: how scikit-learn models are stored by default; it imports all of sklearn)
    import uvicorn  # noqa: F401  (imported for its import time)
    from mlflow.utils import requirements_utils

    from feature_repo import store  # noqa: F401  (imported for its import time)
    from serving.features import reader  # noqa: F401  (imported for its import time)
    from serving.replica_server import app, chat, runtime, standby  # noqa: F401  (imported for their import time)

    try:
        # MLflow checks a model's requirements against the installed packages on load; the package map
        # it builds for that takes seconds the first time (private API: a failure only costs the time)
        requirements_utils._init_packages_to_modules_map()
    except Exception:
        pass
