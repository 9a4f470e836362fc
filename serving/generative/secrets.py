"""Named secrets, as Databricks references them in an external model's config: ``{{secrets/SCOPE/KEY}}``.

A secret is the file ``SCOPE/KEY`` under the secrets folder (``TOLLFREE_HOME/secrets``, written by whoever
runs the gateway, readable by it alone). It is read when a request needs it, so a rotated key applies at
once. A secret's value is never logged, returned or put in an error message; only its reference is.
"""

from __future__ import annotations

import re
from pathlib import Path

SECRET_REFERENCE = re.compile(r"^\{\{\s*secrets/([A-Za-z0-9_.-]{1,128})/([A-Za-z0-9_.-]{1,128})\s*\}\}$")


class SecretMissing(LookupError):
    """No such secret (the message names the reference only)."""


def is_reference(value: str) -> bool:
    return bool(SECRET_REFERENCE.match(value))


class Secrets:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def read(self, reference: str) -> str:
        """The value ``reference`` names, stripped of surrounding white space; SecretMissing if none."""
        match = SECRET_REFERENCE.match(reference)
        if match is None or any(part in (".", "..") for part in match.groups()):
            raise SecretMissing("a secret reference must look like {{secrets/scope/key}}")
        path = self.folder / match.group(1) / match.group(2)
        try:
            value = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            raise SecretMissing(f"secret {match.group(1)}/{match.group(2)} is not set") from None
        if not value:
            raise SecretMissing(f"secret {match.group(1)}/{match.group(2)} is empty")
        return value
