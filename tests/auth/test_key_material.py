"""Key validation and API key tokens, without a store."""

from __future__ import annotations

import time

import pytest

from backend_store.errors import InvalidRequest
from backend_store.types import TenantId
from gateway.auth.api_keys import ApiKey, hash_token, is_api_key, key_id_of
from gateway.auth.jwt_keys import load_verification_key
from gateway.auth.ttl_cache import TtlCache

from .keys import HS_SECRET, ec_pair, ed25519_pair, rsa_pair


def test_hs256_secret_rules() -> None:
    assert load_verification_key("HS256", HS_SECRET) == HS_SECRET
    with pytest.raises(InvalidRequest, match="32 bytes"):
        load_verification_key("HS256", b"short")
    with pytest.raises(InvalidRequest, match="PEM"):
        load_verification_key("HS256", rsa_pair().public_pem)


def test_public_keys_must_fit_their_algorithm() -> None:
    load_verification_key("RS256", rsa_pair().public_pem)
    load_verification_key("ES256", ec_pair().public_pem)
    load_verification_key("EdDSA", ed25519_pair().public_pem)
    with pytest.raises(InvalidRequest, match="RSA"):
        load_verification_key("RS256", ec_pair().public_pem)
    with pytest.raises(InvalidRequest, match="P-256"):
        load_verification_key("ES256", ec_pair("secp384r1").public_pem)
    with pytest.raises(InvalidRequest, match="Ed25519"):
        load_verification_key("EdDSA", rsa_pair().public_pem)


def test_private_keys_and_junk_are_refused() -> None:
    with pytest.raises(InvalidRequest, match="public key"):
        load_verification_key("RS256", rsa_pair().private_pem)
    with pytest.raises(InvalidRequest, match="public key"):
        load_verification_key("ES256", b"not a key")


def test_small_rsa_keys_are_refused() -> None:
    with pytest.raises(InvalidRequest, match="2048"):
        load_verification_key("RS256", rsa_pair(1024).public_pem)


def test_unknown_algorithm() -> None:
    with pytest.raises(InvalidRequest, match="unsupported"):
        load_verification_key("HS512", HS_SECRET)


def test_api_key_token_shape() -> None:
    token = "pgk_0123456789abcdef_" + "A" * 43
    assert is_api_key(token)
    assert key_id_of(token) == "0123456789abcdef"
    assert key_id_of(token + "x") is None
    assert key_id_of("pgk_short_secret") is None
    assert not is_api_key("eyJhbGciOi.x.y")


def test_api_key_matches_only_its_token() -> None:
    token = "pgk_0123456789abcdef_" + "A" * 43
    key = ApiKey("0123456789abcdef", TenantId("t"), frozenset({"admin"}), hash_token(token), time.time())
    assert key.matches(token)
    assert not key.matches(token[:-1] + "B")
    assert "token_hash" not in key.public_dict()
    assert ApiKey.from_bytes(key.to_bytes()) == key


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_ttl_cache_expires_and_bounds() -> None:
    clock = FakeClock()
    cache: TtlCache[str, int] = TtlCache(5.0, max_entries=2, clock=clock)
    cache.put("a", 1)
    assert cache.get("a") == (True, 1)
    clock.now += 5.0
    assert cache.get("a") == (False, None)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("c", 3)
    assert len(cache) == 2
    assert cache.get("a") == (False, None)
    cache.pop("b")
    assert cache.get("b") == (False, None)
    assert cache.get("c") == (True, 3)


def test_ttl_cache_with_zero_ttl_keeps_nothing() -> None:
    cache: TtlCache[str, int] = TtlCache(0)
    cache.put("a", 1)
    assert cache.get("a") == (False, None)
