"""Bearer-token authentication and per-endpoint authorisation.

Tokens are kept only as sha256 digests and compared in constant time against
every known token, so neither timing nor a stray ``repr``/log line reveals them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.gateway.rate_limit import RateLimit
from serving.protocol.errors import permission_denied, unauthenticated

logger = logging.getLogger(__name__)

ADMIN_TOKEN_ENV = "TOLLFREE_TOKEN"
TOKENS_FILE_ENV = "TOLLFREE_TOKENS_FILE"
ADMIN_PRINCIPAL_NAME = "admin"
MIN_TOKEN_LENGTH = 16
_ENTRY_KEYS = frozenset({"name", "token", "endpoints", "rate_limit"})


@dataclass(frozen=True)
class Principal:
    """Who a token belongs to: an admin, or a caller scoped to some endpoints."""

    name: str
    admin: bool
    endpoints: frozenset[str] = frozenset()
    rate_limit: RateLimit | None = None  # per-token limit from the tokens file; None: unlimited

    def can_access(self, endpoint: str) -> bool:
        return self.admin or endpoint in self.endpoints


def _digest(token: str) -> bytes:
    # surrogatepass: header text can hold lone surrogates; keep distinct tokens distinct.
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class Tokens:
    """Maps bearer tokens to principals without keeping the tokens themselves."""

    def __init__(self, tokens: Mapping[str, Principal]) -> None:
        self._entries: tuple[tuple[bytes, Principal], ...] = tuple(
            (_digest(token), principal) for token, principal in tokens.items()
        )

    @property
    def principals(self) -> tuple[Principal, ...]:
        return tuple(p for _, p in self._entries)

    def lookup(self, token: str) -> Principal | None:
        """Constant-time lookup: every entry is compared, with no early exit."""
        if not isinstance(token, str) or not token:
            return None
        digest = _digest(token)
        found: Principal | None = None
        for known, principal in self._entries:
            if hmac.compare_digest(known, digest) and found is None:
                found = principal
        return found

    def __repr__(self) -> str:
        names = ", ".join(repr(p.name) for p in self.principals)
        return f"Tokens(principals=[{names}])"

    __str__ = __repr__

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Tokens:
        """Admin token from TOLLFREE_TOKEN, scoped tokens from TOLLFREE_TOKENS_FILE."""
        admin_token = (environ.get(ADMIN_TOKEN_ENV) or "").strip()
        if len(admin_token) < MIN_TOKEN_LENGTH:
            raise ValueError(
                f"set {ADMIN_TOKEN_ENV} to the admin bearer token (at least {MIN_TOKEN_LENGTH} characters)"
            )
        tokens: dict[str, Principal] = {admin_token: Principal(name=ADMIN_PRINCIPAL_NAME, admin=True)}
        path = (environ.get(TOKENS_FILE_ENV) or "").strip()
        if path:
            for token, principal in _load_tokens_file(Path(path), tokens):
                tokens[token] = principal
        return cls(tokens)


def _load_tokens_file(path: Path, existing: Mapping[str, Principal]) -> Iterable[tuple[str, Principal]]:
    """Validate the scoped-token file; messages name the file and entry, never a token."""
    where = f"{TOKENS_FILE_ENV} {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{where}: cannot read file ({type(exc).__name__})") from None
    try:
        doc: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        # Only the position: the parser's message is safe but the document is not.
        raise ValueError(f"{where}: not valid JSON (line {exc.lineno}, column {exc.colno})") from None
    except (ValueError, RecursionError):
        raise ValueError(f"{where}: not valid JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tokens"), list):
        raise ValueError(f'{where}: expected an object {{"tokens": [...]}}')
    seen_tokens = set(existing)
    seen_names = {p.name for p in existing.values()}
    out: list[tuple[str, Principal]] = []
    for i, entry in enumerate(doc["tokens"]):
        at = f"{where}: tokens[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{at} must be an object with name, token, endpoints")
        unknown = sorted(str(k)[:64] for k in entry if k not in _ENTRY_KEYS)
        if unknown:
            raise ValueError(f"{at} has unknown key(s) {unknown}; accepted: name, token, endpoints, rate_limit")
        name, token, endpoints = entry.get("name"), entry.get("token"), entry.get("endpoints")
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{at}: 'name' must be a non-empty string")
        if name in seen_names:
            raise ValueError(f"{at}: name {name!r} is already used")
        if not isinstance(token, str) or len(token.strip()) < MIN_TOKEN_LENGTH:
            raise ValueError(f"{at}: 'token' must be a string of at least {MIN_TOKEN_LENGTH} characters")
        token = token.strip()
        if token in seen_tokens:
            raise ValueError(f"{at}: 'token' duplicates another token")
        if not isinstance(endpoints, list) or not endpoints or not all(isinstance(e, str) and e for e in endpoints):
            raise ValueError(f"{at}: 'endpoints' must be a non-empty list of endpoint names")
        limit = RateLimit.parse(entry["rate_limit"], at) if "rate_limit" in entry else None
        seen_names.add(name)
        seen_tokens.add(token)
        out.append((token, Principal(name=name, admin=False, endpoints=frozenset(endpoints), rate_limit=limit)))
    return out


def bearer_token(authorization_header: str | None) -> str:
    """Extract the token from ``Authorization: Bearer <token>``; 401 otherwise."""
    if authorization_header is None or not authorization_header.strip():
        raise unauthenticated("missing bearer token")
    scheme, _, rest = authorization_header.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise unauthenticated("authorization header must use the Bearer scheme")
    token = rest.strip()
    if not token:
        raise unauthenticated("missing bearer token")
    if any(c.isspace() for c in token):
        raise unauthenticated("malformed bearer token")
    return token


def authenticate(tokens: Tokens, authorization_header: str | None) -> Principal:
    """The caller's principal, whatever its rights; 401 for a missing or unknown token."""
    principal = tokens.lookup(bearer_token(authorization_header))
    if principal is None:
        logger.info("rejected request with an unknown bearer token")
        raise unauthenticated("invalid access token")
    return principal


def authorize(tokens: Tokens, authorization_header: str | None, endpoint: str | None) -> Principal:
    """Authenticate the caller; ``endpoint=None`` marks an admin-only operation."""
    principal = authenticate(tokens, authorization_header)
    if endpoint is None:
        if not principal.admin:
            logger.info("denied admin operation to principal %s", principal.name)
            raise permission_denied("this operation requires an admin token")
        return principal
    if not principal.can_access(endpoint):
        logger.info("denied endpoint access to principal %s", principal.name)
        raise permission_denied(f"token {principal.name!r} may not access serving endpoint {endpoint[:100]!r}")
    return principal


__all__ = ["ADMIN_TOKEN_ENV", "TOKENS_FILE_ENV", "Principal", "Tokens", "authenticate", "authorize", "bearer_token"]
