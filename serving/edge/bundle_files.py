"""Bundles as home hands them to devices: the file a version's tags name, fetched from the registry once.

The edge bundle flow logs a version's bundle on its run and tags the version ``edge.bundle`` (the artifact's path)
and ``edge.sha256``. ``BundleFiles.path`` downloads it into the cache folder the first time a device asks,
compares its sha256 with the tag, and keeps it (a file whose digest differs is deleted and refused); later asks
are answered from the cache.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

from tollfree_edge.bundle import sha256

BUNDLE_TAG, SHA_TAG, MEASURED_TAG = "edge.bundle", "edge.sha256", "edge.tolerance_measured"


class NoBundle(LookupError):
    """The version has no edge bundle (or its file is not what its tag says)."""


class BundleFiles:
    def __init__(self, tracking_uri: str, cache: Path) -> None:
        self.tracking_uri = tracking_uri
        self.cache = cache
        self._lock = threading.Lock()

    def _tags(self, model: str, version: str) -> tuple[str, str, str]:
        from mlflow import MlflowClient

        client = MlflowClient(self.tracking_uri, self.tracking_uri)
        try:
            found = client.get_model_version(model, version)
        except Exception:  # MLflow's not-found (or a registry that did not answer): no bundle to hand out
            raise NoBundle(f"{model} v{version} is not in the registry (or it did not answer)") from None
        path, digest = found.tags.get(BUNDLE_TAG), found.tags.get(SHA_TAG)
        if not path or not digest:
            raise NoBundle(f"{model} v{version} has no edge bundle: run python -m flows.edge_bundle for it")
        return str(found.run_id), path, digest

    def check(self, model: str, version: str) -> str:
        """The bundle's sha256, when the version has one (``NoBundle`` otherwise)."""
        return self._tags(model, version)[2]

    def path(self, model: str, version: str) -> Path:
        """The bundle's file in the cache, downloaded and checked the first time."""
        name = f"{model}-{version}.tar"
        if "/" in name or name.startswith("."):
            raise NoBundle("a model name or version with a path in it")
        cached = self.cache / name
        with self._lock:
            if cached.exists():
                return cached
            run_id, artifact, digest = self._tags(model, version)
            from mlflow import MlflowClient

            self.cache.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=self.cache) as tmp:
                got = Path(MlflowClient(self.tracking_uri, self.tracking_uri).download_artifacts(run_id, artifact, tmp))
                if sha256(got) != digest:
                    raise NoBundle(f"{model} v{version}: the bundle's file differs from its {SHA_TAG} tag")
                shutil.move(got, cached)
        return cached
