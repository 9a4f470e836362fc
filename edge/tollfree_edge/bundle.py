"""The bundle: what a device serves one model version from, and the check it passes before anything in it loads.

A bundle is one tar file of a flat folder:

- ``manifest.json``: the model's name and version, its input columns in order, the tolerance its conversion was
  verified to, smoke rows with the answers the original model gave them, and the sha256 of every other file;
- ``manifest.sig``: the Ed25519 signature of ``manifest.json``'s bytes;
- ``model.onnx``: the model.

``verify`` checks the signature against the device's public key first, then every file's digest: until both hold,
nothing but the manifest's bytes has been read, and the ONNX file is never parsed. A bundle that fails is refused
(``BundleRefused``, naming the file and the check).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_pem_public_key

FORMAT = "tollfree-edge-bundle/1"
MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
MODEL = "model.onnx"
MAX_FILE_BYTES = 1 << 30  # a member larger than this is refused before it is written


class BundleRefused(ValueError):
    """The bundle must not be loaded; the message names the file and the check it failed."""


@dataclass(frozen=True)
class Manifest:
    """What ``manifest.json`` promises about the bundle (see the module's docstring)."""

    model: str
    version: str
    inputs: tuple[str, ...]
    tolerance: float
    smoke_rows: tuple[tuple[float, ...], ...]
    smoke_expected: tuple[tuple[float, ...], ...]
    files: Mapping[str, str]
    document: Mapping[str, Any]

    @classmethod
    def parse(cls, data: bytes) -> Manifest:
        try:
            doc = json.loads(data)
        except ValueError as exc:
            raise BundleRefused(f"{MANIFEST}: not JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise BundleRefused(f"{MANIFEST}: format is not {FORMAT!r}")
        try:
            inputs = tuple(str(c) for c in doc["inputs"])
            smoke = doc["smoke"]
            manifest = cls(
                model=str(doc["model"]),
                version=str(doc["version"]),
                inputs=inputs,
                tolerance=float(doc["tolerance"]["allowed"]),
                smoke_rows=tuple(tuple(float(v) for v in row) for row in smoke["rows"]),
                smoke_expected=tuple(tuple(float(v) for v in row) for row in smoke["expected"]),
                files={str(k): str(v) for k, v in doc["files"].items()},
                document=doc,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BundleRefused(f"{MANIFEST}: missing or malformed field ({type(exc).__name__}: {exc})") from None
        if not inputs or any(len(row) != len(inputs) for row in manifest.smoke_rows):
            raise BundleRefused(f"{MANIFEST}: smoke rows do not match its {len(inputs)} inputs")
        if len(manifest.smoke_rows) != len(manifest.smoke_expected) or not manifest.smoke_rows:
            raise BundleRefused(f"{MANIFEST}: smoke rows and expected answers differ in number (or are none)")
        if MODEL not in manifest.files:
            raise BundleRefused(f"{MANIFEST}: lists no digest for {MODEL}")
        return manifest


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _plain_name(name: str) -> bool:
    return bool(name) and "/" not in name and "\\" not in name and not name.startswith(".")


def unpack(archive: Path, folder: Path) -> None:
    """The tar file's members into ``folder`` (made empty first): only regular files at its top level, each at most
    ``MAX_FILE_BYTES``; anything else (a path, a link, a device) refuses the whole bundle."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    try:
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                name = member.name.removeprefix("./")
                if not member.isfile() or not _plain_name(name):
                    raise BundleRefused(f"{archive.name}: member {member.name!r} is not a plain file at its top level")
                if member.size > MAX_FILE_BYTES:
                    raise BundleRefused(f"{archive.name}: member {name!r} is over {MAX_FILE_BYTES} bytes")
                source = tar.extractfile(member)
                assert source is not None  # a regular file
                with source, (folder / name).open("wb") as out:
                    shutil.copyfileobj(source, out, 1 << 20)
    except (tarfile.TarError, EOFError) as exc:
        raise BundleRefused(f"{archive.name}: not a readable tar file ({exc})") from None


def verify(folder: Path, key: Ed25519PublicKey) -> Manifest:
    """The bundle in ``folder``'s manifest, once its signature and every file's digest hold (else ``BundleRefused``)."""
    try:
        data, signature = (folder / MANIFEST).read_bytes(), (folder / SIGNATURE).read_bytes()
    except FileNotFoundError as exc:
        raise BundleRefused(f"{Path(str(exc.filename)).name}: missing from the bundle") from None
    try:
        key.verify(signature, data)
    except InvalidSignature:
        raise BundleRefused(f"{SIGNATURE}: not a signature of {MANIFEST} by this device's key") from None
    manifest = Manifest.parse(data)
    present = {p.name for p in folder.iterdir()} - {MANIFEST, SIGNATURE}
    if present != set(manifest.files):
        extra, missing = sorted(present - set(manifest.files)), sorted(set(manifest.files) - present)
        raise BundleRefused(f"files differ from {MANIFEST}: not listed {extra}, missing {missing}")
    for name, expected in manifest.files.items():
        if not _plain_name(name) or sha256(folder / name) != expected:
            raise BundleRefused(f"{name}: sha256 differs from {MANIFEST}")
    return manifest


def sign(folder: Path, key: Ed25519PrivateKey) -> None:
    """``manifest.sig`` for the manifest in ``folder`` (the publisher's side of ``verify``)."""
    (folder / SIGNATURE).write_bytes(key.sign((folder / MANIFEST).read_bytes()))


def pack(folder: Path, archive: Path) -> None:
    """``folder``'s files into one tar file, manifest first, written beside ``archive`` and renamed into place."""
    names = [MANIFEST, SIGNATURE, *sorted(p.name for p in folder.iterdir() if p.name not in (MANIFEST, SIGNATURE))]
    partial = archive.with_name(archive.name + ".partial")
    with tarfile.open(partial, "w") as tar:
        for name in names:
            tar.add(folder / name, arcname=name)
    partial.replace(archive)


def load_public_key(path: Path) -> Ed25519PublicKey:
    try:
        key = load_pem_public_key(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable PEM public key ({type(exc).__name__})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{path}: not an Ed25519 public key")
    return key


def load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        key = load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"{path}: not a readable, unencrypted PEM private key ({type(exc).__name__})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path}: not an Ed25519 private key")
    return key
