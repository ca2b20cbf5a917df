"""JWT verification against keys held in memory (no store)."""

from __future__ import annotations

import time
from typing import Any

import jwt
import pytest

from backend_store.errors import Unauthorized
from backend_store.types import TenantId
from gateway.auth.jwt_keys import Algorithm, JwtKey, load_verification_key
from gateway.auth.jwt_verify import principal_from_claims, read_header, verify_claims

from .keys import HS_SECRET, OTHER_HS_SECRET, ec_pair, ed25519_pair, rsa_pair


def make_key(alg: Algorithm, material: bytes, tenant: str = "acme", kid: str = "k1") -> JwtKey:
    return JwtKey(TenantId(tenant), kid, alg, material, time.time())


def claims(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "sub": "user-1",
        "tenant": "acme",
        "scope": "send:orders-* receive:orders-1",
        "exp": int(time.time()) + 300,
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def sign(payload: dict[str, Any], key: Any, alg: str = "HS256", kid: str | None = "k1") -> str:
    headers = {"kid": kid} if kid is not None else {}
    return jwt.encode(payload, key, algorithm=alg, headers=headers)


def verify(token: str, key: JwtKey, audience: str | None = None, leeway_s: float = 0.0) -> dict[str, Any]:
    return verify_claims(
        token, key, load_verification_key(key.alg, key.material), audience=audience, leeway_s=leeway_s
    )


def expect_unauthorized(token: str, key: JwtKey, match: str, **kwargs: Any) -> None:
    with pytest.raises(Unauthorized, match=match):
        verify(token, key, **kwargs)


@pytest.mark.parametrize(
    ("alg", "pair"),
    [("RS256", "rsa"), ("ES256", "ec"), ("EdDSA", "ed25519")],
)
def test_asymmetric_algorithms_verify(alg: Algorithm, pair: str) -> None:
    keys = {"rsa": rsa_pair, "ec": ec_pair, "ed25519": ed25519_pair}[pair]()
    key = make_key(alg, keys.public_pem)
    token = sign(claims(), keys.private, alg)
    principal = principal_from_claims(verify(token, key))
    assert principal.tenant == "acme"
    assert principal.subject == "user-1"
    assert principal.scopes == {"send:orders-*", "receive:orders-1"}
    assert principal.via == "jwt"
    assert principal.expires_at is not None and principal.expires_at > time.time()


def test_hs256_verifies() -> None:
    key = make_key("HS256", HS_SECRET)
    assert verify(sign(claims(), HS_SECRET), key)["sub"] == "user-1"


def test_expired() -> None:
    key = make_key("HS256", HS_SECRET)
    expect_unauthorized(sign(claims(exp=int(time.time()) - 60), HS_SECRET), key, "expired")


def test_leeway_tolerates_small_skew() -> None:
    key = make_key("HS256", HS_SECRET)
    token = sign(claims(exp=int(time.time()) - 5), HS_SECRET)
    assert verify(token, key, leeway_s=30)["sub"] == "user-1"


def test_wrong_hmac_secret() -> None:
    key = make_key("HS256", HS_SECRET)
    expect_unauthorized(sign(claims(), OTHER_HS_SECRET), key, "signature does not verify")


def test_wrong_rsa_key() -> None:
    key = make_key("RS256", rsa_pair().public_pem)
    other = rsa_pair(3072)
    expect_unauthorized(sign(claims(), other.private, "RS256"), key, "signature does not verify")


def test_alg_none_is_refused() -> None:
    key = make_key("HS256", HS_SECRET)
    token = sign(claims(), None, "none")
    expect_unauthorized(token, key, "does not match key")


def test_alg_none_is_refused_by_pyjwt_too() -> None:
    # Even without our header check, algorithms=[key.alg] refuses it.
    key = make_key("HS256", HS_SECRET)
    token = sign(claims(), None, "none")
    with pytest.raises(jwt.InvalidAlgorithmError):
        jwt.decode(token, HS_SECRET, algorithms=[key.alg])


def test_hs256_signed_with_rsa_public_key_is_refused() -> None:
    """Algorithm confusion: the attacker knows the public key and uses it as an HMAC secret."""
    public_pem = rsa_pair().public_pem
    key = make_key("RS256", public_pem)
    # PyJWT refuses to sign with a PEM as HMAC secret, so forge the token by hand.
    import base64
    import hashlib
    import hmac
    import json

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    header = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "k1"}).encode())
    payload = b64(json.dumps(claims()).encode())
    signature = hmac.new(public_pem, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    token = f"{header}.{payload}.{b64(signature)}"
    expect_unauthorized(token, key, "does not match key")
    with pytest.raises(jwt.InvalidAlgorithmError):
        jwt.decode(token, load_verification_key("RS256", public_pem), algorithms=["RS256"])


def test_missing_exp() -> None:
    key = make_key("HS256", HS_SECRET)
    expect_unauthorized(sign(claims(exp=None), HS_SECRET), key, "'exp'")


def test_missing_sub() -> None:
    key = make_key("HS256", HS_SECRET)
    expect_unauthorized(sign(claims(sub=None), HS_SECRET), key, "'sub'")


def test_nbf_in_future() -> None:
    key = make_key("HS256", HS_SECRET)
    token = sign(claims(nbf=int(time.time()) + 300), HS_SECRET)
    expect_unauthorized(token, key, "not valid yet")


def test_nbf_in_past_is_fine() -> None:
    key = make_key("HS256", HS_SECRET)
    assert verify(sign(claims(nbf=int(time.time()) - 10), HS_SECRET), key)


def test_aud_matches_when_configured() -> None:
    key = make_key("HS256", HS_SECRET)
    assert verify(sign(claims(aud="pushgate"), HS_SECRET), key, audience="pushgate")
    assert verify(sign(claims(aud=["other", "pushgate"]), HS_SECRET), key, audience="pushgate")


def test_aud_mismatch() -> None:
    key = make_key("HS256", HS_SECRET)
    expect_unauthorized(sign(claims(aud="billing"), HS_SECRET), key, "audience", audience="pushgate")


def test_aud_required_when_configured() -> None:
    key = make_key("HS256", HS_SECRET)
    expect_unauthorized(sign(claims(), HS_SECRET), key, "'aud'", audience="pushgate")


def test_aud_refused_when_gateway_expects_none() -> None:
    key = make_key("HS256", HS_SECRET)
    expect_unauthorized(sign(claims(aud="billing"), HS_SECRET), key, "expects no audience")


def test_tenant_must_match_the_key() -> None:
    key = make_key("HS256", HS_SECRET, tenant="acme")
    expect_unauthorized(sign(claims(tenant="globex"), HS_SECRET), key, "tenant does not match")


def test_header_without_kid() -> None:
    with pytest.raises(Unauthorized, match="no kid"):
        read_header(sign(claims(), HS_SECRET, kid=None))


def test_token_without_tenant() -> None:
    with pytest.raises(Unauthorized, match="no tenant"):
        read_header(sign(claims(tenant=None), HS_SECRET))


@pytest.mark.parametrize("token", ["garbage", "a.b.c", "pgk-nope"])
def test_garbage_is_malformed(token: str) -> None:
    with pytest.raises(Unauthorized, match="malformed"):
        read_header(token)


def test_scope_as_list_and_foreign_scopes() -> None:
    key = make_key("HS256", HS_SECRET)
    token = sign(claims(scope=["openid", "send:q"]), HS_SECRET)
    assert principal_from_claims(verify(token, key)).scopes == {"send:q"}


def test_scope_of_wrong_type() -> None:
    key = make_key("HS256", HS_SECRET)
    expect_unauthorized(sign(claims(scope=7), HS_SECRET), key, "scope")


def test_missing_scope_means_no_scopes() -> None:
    key = make_key("HS256", HS_SECRET)
    principal = principal_from_claims(verify(sign(claims(scope=None), HS_SECRET), key))
    assert principal.scopes == frozenset()
    assert not principal.can("send", "q")
