"""The publisher's Ed25519 key pair: bundles are signed with the private key, devices hold the public one.

By default the pair lives in ``$TOLLFREE_HOME/edge/``: ``signing-key.pem`` (made on first use, readable by its
owner only) and ``signing-key.pub.pem``, the file a device is given. A key from elsewhere (a secret store) is
passed as a path instead.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from tollfree_edge.bundle import load_private_key

PRIVATE = "signing-key.pem"
PUBLIC = "signing-key.pub.pem"


def default_key_path(home: Path) -> Path:
    return home / "edge" / PRIVATE


def public_key_path(private: Path) -> Path:
    return private.with_name(private.name.removesuffix(".pem") + ".pub.pem")


def signing_key(path: Path, create: bool) -> Ed25519PrivateKey:
    """The private key at ``path``; made there (with its public half beside it) when missing and ``create``."""
    if not path.exists():
        if not create:
            raise FileNotFoundError(f"{path}: no signing key there")
        key = Ed25519PrivateKey.generate()
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
        public_key_path(path).write_bytes(
            key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
        )
        partial.replace(path)
        return key
    return load_private_key(path)
