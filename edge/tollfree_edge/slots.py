"""The bundles a device keeps, and which of them it serves.

``FOLDER/bundles/VERSION/`` holds each verified bundle, unpacked; ``FOLDER/slots.json`` names the ``current`` and
the ``previous`` one (written to a temporary file and renamed, so a power cut leaves one or the other). A bundle
is verified when it arrives and again each time it is loaded: a file changed on the device's disk since is
refused like a tampered download.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from tollfree_edge.bundle import BundleRefused, Manifest, unpack, verify
from tollfree_edge.model import EdgeModel

KEEP = 2  # bundles kept on disk besides the current one: the previous (the rollback) and one more


@dataclass(frozen=True)
class SlotState:
    current: str | None = None
    previous: str | None = None


class Slots:
    def __init__(self, folder: Path, key: Ed25519PublicKey) -> None:
        self.folder = folder
        self.key = key
        self.bundles = folder / "bundles"
        self.bundles.mkdir(parents=True, exist_ok=True)
        self._state_file = folder / "slots.json"

    def state(self) -> SlotState:
        try:
            doc = json.loads(self._state_file.read_text())
        except FileNotFoundError:
            return SlotState()
        return SlotState(doc.get("current"), doc.get("previous"))

    def save(self, state: SlotState) -> None:
        partial = self._state_file.with_suffix(".partial")
        partial.write_text(json.dumps({"current": state.current, "previous": state.previous}))
        os.replace(partial, self._state_file)

    def install(self, archive: Path) -> Manifest:
        """The archive unpacked and verified, kept as ``bundles/VERSION`` (``BundleRefused``: nothing is kept)."""
        incoming = self.bundles / ".incoming"
        try:
            unpack(archive, incoming)
            manifest = verify(incoming, self.key)
        except BundleRefused:
            shutil.rmtree(incoming, ignore_errors=True)
            raise
        if not manifest.version.replace("-", "").replace(".", "").isalnum():
            shutil.rmtree(incoming, ignore_errors=True)
            raise BundleRefused(f"manifest.json: version {manifest.version!r} is not a plain name")
        target = self.bundles / manifest.version
        shutil.rmtree(target, ignore_errors=True)
        incoming.rename(target)
        return manifest

    def has(self, version: str) -> bool:
        return (self.bundles / version).is_dir()

    def load(self, version: str) -> EdgeModel:
        """The kept bundle ``version``, verified again, then loaded."""
        folder = self.bundles / version
        if not folder.is_dir():
            raise BundleRefused(f"bundle {version!r} is not on this device")
        return EdgeModel(folder, verify(folder, self.key))

    def prune(self) -> None:
        """Drop kept bundles other than the current, the previous and the newest ``KEEP`` others."""
        state = self.state()
        keep = {state.current, state.previous}
        others = sorted(
            (p for p in self.bundles.iterdir() if p.is_dir() and p.name not in keep and not p.name.startswith(".")),
            key=lambda p: p.stat().st_mtime,
        )
        for old in others[: max(0, len(others) - KEEP)]:
            shutil.rmtree(old, ignore_errors=True)
