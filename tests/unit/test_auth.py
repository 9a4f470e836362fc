from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving.gateway.auth import Principal, Tokens, authorize, bearer_token
from serving.protocol.errors import ApiError

ADMIN_TOKEN = "admin-SECRET-VALUE-123"
SCOPED_TOKEN = "scoped-SECRET-VALUE-456"
OTHER_TOKEN = "other-SECRET-VALUE-789"


def _write(tmp_path: Path, doc: object) -> str:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return str(path)


@pytest.fixture
def registry(tmp_path: Path) -> Tokens:
    tokens_file = _write(
        tmp_path,
        {
            "tokens": [
                {"name": "svc-a", "token": SCOPED_TOKEN, "endpoints": ["fraud", "churn"]},
                {"name": "svc-b", "token": OTHER_TOKEN, "endpoints": ["churn"]},
            ]
        },
    )
    return Tokens.from_environ({"TOLLFREE_TOKEN": ADMIN_TOKEN, "TOLLFREE_TOKENS_FILE": tokens_file})


def _denied(registry: Tokens, header: str | None, endpoint: str | None) -> ApiError:
    with pytest.raises(ApiError) as info:
        authorize(registry, header, endpoint)
    for token in (ADMIN_TOKEN, SCOPED_TOKEN, OTHER_TOKEN):
        assert token not in info.value.message
    return info.value


def test_principal_can_access() -> None:
    scoped = Principal(name="a", admin=False, endpoints=frozenset({"x"}))
    assert scoped.can_access("x") and not scoped.can_access("y")
    assert Principal(name="root", admin=True, endpoints=frozenset()).can_access("anything")


def test_lookup(registry: Tokens) -> None:
    admin = registry.lookup(ADMIN_TOKEN)
    assert admin is not None and admin.admin and admin.name == "admin"
    scoped = registry.lookup(SCOPED_TOKEN)
    assert scoped == Principal("svc-a", False, frozenset({"fraud", "churn"}))
    assert registry.lookup("nope-nope-nope-nope") is None
    assert registry.lookup(ADMIN_TOKEN[:-1]) is None
    assert registry.lookup(ADMIN_TOKEN + "x") is None
    assert registry.lookup("") is None


def test_registry_from_mapping_and_repr(registry: Tokens) -> None:
    reg = Tokens({"t" * 20: Principal("p1", True, frozenset())})
    assert reg.lookup("t" * 20) == Principal("p1", True, frozenset())
    for text in (repr(registry), str(registry)):
        assert "svc-a" in text and "admin" in text
        for token in (ADMIN_TOKEN, SCOPED_TOKEN, OTHER_TOKEN):
            assert token not in text
    assert all(token not in repr(vars(registry)) for token in (ADMIN_TOKEN, SCOPED_TOKEN))


def test_admin_may_do_anything(registry: Tokens) -> None:
    assert authorize(registry, f"Bearer {ADMIN_TOKEN}", None).admin
    assert authorize(registry, f"bearer {ADMIN_TOKEN}", "any-endpoint").name == "admin"


def test_scoped_token(registry: Tokens) -> None:
    assert authorize(registry, f"Bearer {SCOPED_TOKEN}", "fraud").name == "svc-a"
    assert authorize(registry, f"BEARER  {SCOPED_TOKEN} ", "churn").name == "svc-a"
    err = _denied(registry, f"Bearer {OTHER_TOKEN}", "fraud")
    assert (err.status_code, err.error_code) == (403, "PERMISSION_DENIED")
    err = _denied(registry, f"Bearer {SCOPED_TOKEN}", None)
    assert (err.status_code, err.error_code) == (403, "PERMISSION_DENIED")
    assert "admin" in err.message


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "   ",
        "Bearer",
        "Bearer   ",
        f"Basic {ADMIN_TOKEN}",
        ADMIN_TOKEN,
        f"Token {ADMIN_TOKEN}",
        "Bearer unknown-token-value-xyz",
        f"Bearer {ADMIN_TOKEN} extra",
    ],
)
def test_unauthenticated(registry: Tokens, header: str | None) -> None:
    err = _denied(registry, header, "fraud")
    assert (err.status_code, err.error_code) == (401, "UNAUTHENTICATED")
    assert err.headers.get("WWW-Authenticate") == "Bearer"


def test_bearer_token_parsing() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bEaReR   abc  ") == "abc"
    with pytest.raises(ApiError) as info:
        bearer_token(None)
    assert info.value.status_code == 401 and info.value.message == "missing bearer token"
    with pytest.raises(ApiError) as info:
        bearer_token(f"Basic {ADMIN_TOKEN}")
    assert info.value.status_code == 401 and ADMIN_TOKEN not in info.value.message


@pytest.mark.parametrize("environ", [{}, {"TOLLFREE_TOKEN": ""}, {"TOLLFREE_TOKEN": "short-SECRET"}])
def test_from_environ_requires_admin_token(environ: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="set TOLLFREE_TOKEN") as info:
        Tokens.from_environ(environ)
    assert "short-SECRET" not in str(info.value)


def test_from_environ_admin_only() -> None:
    reg = Tokens.from_environ({"TOLLFREE_TOKEN": f"  {ADMIN_TOKEN}\n"})
    assert [p.name for p in reg.principals] == ["admin"]
    assert reg.lookup(ADMIN_TOKEN) is not None


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ("{not json " + SCOPED_TOKEN, "not valid JSON"),
        ([], '"tokens"'),
        ({"tokens": {"name": "x"}}, '"tokens"'),
        ({"tokens": [SCOPED_TOKEN]}, "tokens[0] must be an object"),
        ({"tokens": [{"name": "a", "token": SCOPED_TOKEN}]}, "tokens[0]: 'endpoints'"),
        ({"tokens": [{"name": "a", "token": SCOPED_TOKEN, "endpoints": []}]}, "tokens[0]: 'endpoints'"),
        ({"tokens": [{"name": "a", "token": SCOPED_TOKEN, "endpoints": [1]}]}, "tokens[0]: 'endpoints'"),
        ({"tokens": [{"name": "", "token": SCOPED_TOKEN, "endpoints": ["e"]}]}, "tokens[0]: 'name'"),
        ({"tokens": [{"name": "a", "token": "short-SECRET", "endpoints": ["e"]}]}, "tokens[0]: 'token'"),
        ({"tokens": [{"name": "a", "token": 12345, "endpoints": ["e"]}]}, "tokens[0]: 'token'"),
        (
            {"tokens": [{"name": "a", "token": SCOPED_TOKEN, "endpoints": ["e"], "admin": True}]},
            "tokens[0] has unknown key",
        ),
        (
            {
                "tokens": [
                    {"name": "a", "token": SCOPED_TOKEN, "endpoints": ["e"]},
                    {"name": "b", "token": SCOPED_TOKEN, "endpoints": ["e"]},
                ]
            },
            "tokens[1]: 'token' duplicates",
        ),
        ({"tokens": [{"name": "a", "token": ADMIN_TOKEN, "endpoints": ["e"]}]}, "tokens[0]: 'token' duplicates"),
        (
            {
                "tokens": [
                    {"name": "a", "token": SCOPED_TOKEN, "endpoints": ["e"]},
                    {"name": "a", "token": OTHER_TOKEN, "endpoints": ["e"]},
                ]
            },
            "tokens[1]: name 'a'",
        ),
    ],
)
def test_tokens_file_errors(tmp_path: Path, doc: object, fragment: str) -> None:
    path = _write(tmp_path, doc)
    with pytest.raises(ValueError) as info:
        Tokens.from_environ({"TOLLFREE_TOKEN": ADMIN_TOKEN, "TOLLFREE_TOKENS_FILE": path})
    message = str(info.value)
    assert path in message
    assert fragment in message
    for secret in (ADMIN_TOKEN, SCOPED_TOKEN, OTHER_TOKEN, "short-SECRET"):
        assert secret not in message


def test_tokens_file_missing(tmp_path: Path) -> None:
    path = str(tmp_path / "absent.json")
    with pytest.raises(ValueError, match="cannot read") as info:
        Tokens.from_environ({"TOLLFREE_TOKEN": ADMIN_TOKEN, "TOLLFREE_TOKENS_FILE": path})
    assert path in str(info.value)


def test_lookup_compares_every_token_without_early_exit(registry: Tokens, monkeypatch: pytest.MonkeyPatch) -> None:
    import serving.gateway.auth as auth

    calls: list[tuple[int, int]] = []
    real = auth.hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    for token in (ADMIN_TOKEN, OTHER_TOKEN, "x" * 40):
        calls.clear()
        registry.lookup(token)
        # One comparison per known token, always of fixed-size digests.
        assert calls == [(32, 32)] * 3
