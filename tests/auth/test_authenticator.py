"""The Authenticator against a real embedded store."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import jwt
import pytest

from backend_store.backend import Backend
from backend_store.errors import Forbidden, InvalidRequest, NotFound, Unauthorized
from backend_store.types import TenantId
from gateway.auth.api_keys import ApiKeyStore
from gateway.auth.authenticator import Authenticator
from gateway.auth.jwt_keys import MINTING_KID, JwtKeyStore
from gateway.auth.principal import Principal
from tests.conftest import ManualClock, scaled

from .keys import HS_SECRET, OTHER_HS_SECRET, ed25519_pair, rsa_pair


async def new_key(auth: Authenticator, scopes: str, tenant: str = "acme") -> str:
    if await auth.tenants.get(tenant) is None:
        await auth.tenants.create(tenant)
    _, token = await auth.api_keys.create(tenant, scopes)
    return token


def jwt_for(key: Any, alg: str = "HS256", kid: str = "k1", **claims: Any) -> str:
    payload = {"sub": "u1", "tenant": "acme", "scope": "send:q", "exp": int(time.time()) + 60}
    payload.update(claims)
    return jwt.encode(payload, key, algorithm=alg, headers={"kid": kid})


# API keys -------------------------------------------------------------------


async def test_api_key_authenticates(auth: Authenticator) -> None:
    token = await new_key(auth, "send:orders-* receive:*")
    principal = await auth.authenticate(token)
    assert principal.tenant == "acme"
    assert principal.scopes == {"send:orders-*", "receive:*"}
    assert principal.via == "api_key"
    assert principal.expires_at is None
    assert principal.can("send", "orders-1") and not principal.can("send", "billing")


async def test_wrong_secret_unknown_and_malformed_keys(auth: Authenticator) -> None:
    token = await new_key(auth, "admin")
    for bad, reason in [
        (token[:-1] + ("A" if token[-1] != "A" else "B"), "invalid API key"),
        ("pgk_0000000000000000_" + "A" * 43, "invalid API key"),
        ("pgk_nonsense", "malformed API key"),
        ("", "missing"),
        ("x" * 9000, "too long"),
    ]:
        with pytest.raises(Unauthorized, match=reason):
            await auth.authenticate(bad)


async def test_revoke_through_this_process_is_immediate(auth: Authenticator) -> None:
    token = await new_key(auth, "admin")
    principal = await auth.authenticate(token)
    await auth.api_keys.revoke(principal.subject)
    with pytest.raises(Unauthorized, match="revoked"):
        await auth.authenticate(token)


async def test_revoke_elsewhere_takes_effect_after_the_cache_ttl(
    auth: Authenticator, backend: Backend, cache_clock: ManualClock
) -> None:
    token = await new_key(auth, "admin")
    principal = await auth.authenticate(token)
    # Another process (pushgate admin) revokes: this process's cache does not hear of it.
    await ApiKeyStore(backend).revoke(principal.subject)
    assert await auth.authenticate(token) == principal
    cache_clock.advance(5.0)
    with pytest.raises(Unauthorized, match="revoked"):
        await auth.authenticate(token)


async def test_a_token_first_seen_late_lives_no_longer_than_the_key_record_it_used(
    auth: Authenticator, backend: Backend, cache_clock: ManualClock
) -> None:
    """A minted token first used 4 s after its API key's record was cached, and the key
    revoked elsewhere in between: refused when that record expires, not 5 s after its own
    first use (docs/auth.md: changes made elsewhere apply within 5 s)."""
    key = await auth.authenticate(await new_key(auth, "send:q"))  # the key record is cached now
    token, _ = await auth.mint_token(key, "send:q", 600)
    await ApiKeyStore(backend).revoke(key.subject)  # another process
    cache_clock.advance(4.0)
    assert (await auth.authenticate(token)).key_id == key.subject  # the cached record still says active
    cache_clock.advance(1.0)
    with pytest.raises(Unauthorized, match="revoked"):
        await auth.authenticate(token)


async def test_a_jwt_first_seen_late_lives_no_longer_than_the_jwt_key_it_used(
    auth: Authenticator, backend: Backend, cache_clock: ManualClock
) -> None:
    await auth.tenants.create("acme")
    await auth.jwt_keys.add("acme", "k1", "HS256", HS_SECRET)
    await auth.authenticate(jwt_for(HS_SECRET, sub="first"))  # the JWT key is cached now
    await JwtKeyStore(backend).remove("acme", "k1")  # another process
    cache_clock.advance(4.0)
    late = jwt_for(HS_SECRET, sub="late")
    await auth.authenticate(late)
    cache_clock.advance(1.0)
    with pytest.raises(Unauthorized, match="unknown JWT key"):
        await auth.authenticate(late)


async def test_revoke_twice_and_unknown(auth: Authenticator) -> None:
    token = await new_key(auth, "admin")
    key_id = (await auth.authenticate(token)).subject
    first = await auth.api_keys.revoke(key_id)
    again = await auth.api_keys.revoke(key_id)
    assert first.revoked_at == again.revoked_at is not None
    with pytest.raises(NotFound):
        await auth.api_keys.revoke("0000000000000000")


async def test_key_list_has_no_secrets(auth: Authenticator) -> None:
    token = await new_key(auth, "send:a")
    await new_key(auth, "send:b", tenant="other")
    keys = await auth.api_keys.list_for_tenant("acme")
    assert [k.public_dict()["scopes"] for k in keys] == [["send:a"]]
    assert token not in str([k.public_dict() for k in keys])
    assert keys[0].token_hash not in str(keys[0].public_dict())


async def test_key_for_missing_tenant_or_bad_scope(auth: Authenticator) -> None:
    with pytest.raises(NotFound):
        await auth.api_keys.create("ghost", "admin")
    await auth.tenants.create("acme")
    with pytest.raises(InvalidRequest):
        await auth.api_keys.create("acme", "superuser")


# JWTs -----------------------------------------------------------------------


async def test_registered_jwt_keys_verify(auth: Authenticator) -> None:
    await auth.tenants.create("acme")
    await auth.jwt_keys.add("acme", "k1", "HS256", HS_SECRET)
    await auth.jwt_keys.add("acme", "rsa", "RS256", rsa_pair().public_pem)
    await auth.jwt_keys.add("acme", "ed", "EdDSA", ed25519_pair().public_pem)
    for token in [
        jwt_for(HS_SECRET),
        jwt_for(rsa_pair().private, "RS256", "rsa"),
        jwt_for(ed25519_pair().private, "EdDSA", "ed"),
    ]:
        principal = await auth.authenticate(token)
        assert (principal.tenant, principal.subject, principal.via) == ("acme", "u1", "jwt")
        assert principal.scopes == {"send:q"}


async def test_jwt_failures_through_the_authenticator(auth: Authenticator) -> None:
    await auth.tenants.create("acme")
    await auth.jwt_keys.add("acme", "k1", "HS256", HS_SECRET)
    await auth.jwt_keys.add("acme", "rsa", "RS256", rsa_pair().public_pem)
    cases = [
        (jwt_for(HS_SECRET, kid="nope"), "unknown JWT key"),
        (jwt_for(OTHER_HS_SECRET), "signature"),
        (jwt_for(HS_SECRET, exp=int(time.time()) - 30), "expired"),
        (jwt_for(HS_SECRET, nbf=int(time.time()) + 300), "not valid yet"),
        (jwt_for(None, alg="none"), "algorithm"),
        (jwt_for(HS_SECRET, kid="rsa"), "algorithm"),
        (jwt_for(HS_SECRET, aud="someone-else"), "audience"),
        (jwt_for(HS_SECRET, exp=None), "'exp'"),
        ("not-a-token", "malformed"),
    ]
    for token, reason in cases:
        with pytest.raises(Unauthorized, match=reason):
            await auth.authenticate(token)


async def test_tenants_cannot_use_each_others_keys(auth: Authenticator) -> None:
    await auth.tenants.create("acme")
    await auth.tenants.create("globex")
    await auth.jwt_keys.add("acme", "k1", "HS256", HS_SECRET)
    # Signed with acme's key but claiming globex: globex has no such kid.
    with pytest.raises(Unauthorized, match="unknown JWT key"):
        await auth.authenticate(jwt_for(HS_SECRET, tenant="globex"))
    # globex has a kid of the same name with its own secret: acme's signature fails there.
    await auth.jwt_keys.add("globex", "k1", "HS256", OTHER_HS_SECRET)
    with pytest.raises(Unauthorized, match="signature"):
        await auth.authenticate(jwt_for(HS_SECRET, tenant="globex"))
    assert (await auth.authenticate(jwt_for(OTHER_HS_SECRET, tenant="globex"))).tenant == "globex"


async def test_names_from_the_token_cannot_splice_storage_keys(auth: Authenticator) -> None:
    await auth.tenants.create("acme")
    await auth.jwt_keys.add("acme", "k1/x", "HS256", HS_SECRET)
    assert (await auth.authenticate(jwt_for(HS_SECRET, kid="k1/x"))).tenant == "acme"
    # "acme/k1" + "/" + "x" would name acme's key "k1/x".
    with pytest.raises(Unauthorized, match="unknown JWT key"):
        await auth.authenticate(jwt_for(HS_SECRET, tenant="acme/k1", kid="x"))
    for tenant, kid in [("acme", "k\x00"), ("ac\x00me", "k1"), ("acme", "")]:
        with pytest.raises(Unauthorized, match="unknown JWT key"):
            await auth.authenticate(jwt_for(HS_SECRET, tenant=tenant, kid=kid))


async def test_audience_when_configured(backend: Backend) -> None:
    auth = Authenticator(backend, audience="pushgate")
    await auth.tenants.create("acme")
    await auth.jwt_keys.add("acme", "k1", "HS256", HS_SECRET)
    assert (await auth.authenticate(jwt_for(HS_SECRET, aud="pushgate"))).tenant == "acme"
    with pytest.raises(Unauthorized, match="audience"):
        await auth.authenticate(jwt_for(HS_SECRET, aud="billing"))
    with pytest.raises(Unauthorized, match="'aud'"):
        await auth.authenticate(jwt_for(HS_SECRET))


async def test_jwt_key_removed_elsewhere_stops_working_after_the_cache_ttl(
    auth: Authenticator, backend: Backend, cache_clock: ManualClock
) -> None:
    await auth.tenants.create("acme")
    await auth.jwt_keys.add("acme", "k1", "HS256", HS_SECRET)
    token = jwt_for(HS_SECRET)
    principal = await auth.authenticate(token)
    await JwtKeyStore(backend).remove("acme", "k1")  # another process
    assert await auth.authenticate(token) == principal
    cache_clock.advance(5.0)
    with pytest.raises(Unauthorized, match="unknown JWT key"):
        await auth.authenticate(token)


async def test_a_cached_token_still_expires_on_time(auth: Authenticator) -> None:
    """The cache clock stands still here, so only the expiry check can refuse the token."""
    await auth.tenants.create("acme")
    await auth.jwt_keys.add("acme", "k1", "HS256", HS_SECRET)
    exp = math.ceil(time.time() + 0.2)
    token = jwt_for(HS_SECRET, exp=exp)
    await auth.authenticate(token)
    deadline = time.monotonic() + scaled(5)
    while time.time() < exp:  # real time must pass exp; at most ~1.2 s, in small steps
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    with pytest.raises(Unauthorized, match="expired"):
        await auth.authenticate(token)


async def test_removing_a_jwt_key_is_immediate(auth: Authenticator) -> None:
    await auth.tenants.create("acme")
    await auth.jwt_keys.add("acme", "k1", "HS256", HS_SECRET)
    token = jwt_for(HS_SECRET)
    await auth.authenticate(token)
    await auth.jwt_keys.remove("acme", "k1")
    with pytest.raises(Unauthorized, match="unknown JWT key"):
        await auth.authenticate(token)
    with pytest.raises(NotFound):
        await auth.jwt_keys.remove("acme", "k1")


async def test_jwt_key_registration_rules(auth: Authenticator) -> None:
    with pytest.raises(NotFound):
        await auth.jwt_keys.add("ghost", "k1", "HS256", HS_SECRET)
    await auth.tenants.create("acme")
    await auth.jwt_keys.add("acme", "k1", "HS256", HS_SECRET)
    with pytest.raises(InvalidRequest, match="already has"):
        await auth.jwt_keys.add("acme", "k1", "HS256", OTHER_HS_SECRET)
    with pytest.raises(InvalidRequest, match="reserved"):
        await auth.jwt_keys.add("acme", MINTING_KID, "HS256", HS_SECRET)
    with pytest.raises(InvalidRequest, match="kid"):
        await auth.jwt_keys.add("acme", "has space", "HS256", HS_SECRET)
    listed = [k.public_dict() for k in await auth.jwt_keys.list_for_tenant("acme")]
    assert [(k["kid"], k["alg"]) for k in listed] == [("k1", "HS256")]
    assert "material" not in listed[0]


# Minting --------------------------------------------------------------------


async def test_mint_within_the_key(auth: Authenticator) -> None:
    key = await auth.authenticate(await new_key(auth, "send:orders-* receive:*"))
    before = time.time()
    token, expires_at = await auth.mint_token(key, "send:orders-eu receive:orders-1", 60)
    assert before + 58 <= expires_at <= time.time() + 60
    principal = await auth.authenticate(token)
    assert principal.scopes == {"send:orders-eu", "receive:orders-1"}
    assert (principal.tenant, principal.subject, principal.via) == ("acme", key.subject, "jwt")
    assert principal.expires_at == expires_at
    assert jwt.get_unverified_header(token)["kid"] == MINTING_KID


async def test_mint_defaults_to_the_keys_scopes_and_900_s(auth: Authenticator) -> None:
    key = await auth.authenticate(await new_key(auth, "send:orders-*"))
    token, expires_at = await auth.mint_token(key)
    assert 890 <= expires_at - time.time() <= 900
    assert (await auth.authenticate(token)).scopes == {"send:orders-*"}


@pytest.mark.parametrize(
    "scope", ["send:*", "admin", "receive:orders-1", "send:orders-1 send:billing", "send:orders?"]
)
async def test_mint_wider_than_the_key_is_forbidden(auth: Authenticator, scope: str) -> None:
    key = await auth.authenticate(await new_key(auth, "send:orders-*"))
    with pytest.raises(Forbidden, match="wider"):
        await auth.mint_token(key, scope, 60)


async def test_admin_key_mints_anything(auth: Authenticator) -> None:
    key = await auth.authenticate(await new_key(auth, "admin"))
    token, _ = await auth.mint_token(key, "admin send:*", 60)
    assert (await auth.authenticate(token)).can("admin")


@pytest.mark.parametrize("ttl", [0, 0.5, 86401, -1, float("nan"), True, "60"])
async def test_mint_ttl_bounds(auth: Authenticator, ttl: Any) -> None:
    key = await auth.authenticate(await new_key(auth, "admin"))
    with pytest.raises(InvalidRequest, match="ttl_s"):
        await auth.mint_token(key, "send:q", ttl)


async def test_mint_rejects_bad_scope_text(auth: Authenticator) -> None:
    key = await auth.authenticate(await new_key(auth, "admin"))
    with pytest.raises(InvalidRequest):
        await auth.mint_token(key, "", 60)
    with pytest.raises(InvalidRequest):
        await auth.mint_token(key, "root", 60)


async def test_only_api_keys_mint(auth: Authenticator) -> None:
    key = await auth.authenticate(await new_key(auth, "admin"))
    token, _ = await auth.mint_token(key, "send:q", 60)
    minted = await auth.authenticate(token)
    with pytest.raises(Forbidden, match="API key"):
        await auth.mint_token(minted, "send:q", 60)
    with pytest.raises(Forbidden):
        await auth.mint_token(Principal(TenantId("acme"), frozenset({"admin"}), "code"), "send:q", 60)


async def test_minted_tokens_die_with_their_key(auth: Authenticator) -> None:
    key = await auth.authenticate(await new_key(auth, "send:q"))
    token, _ = await auth.mint_token(key, "send:q", 600)
    await auth.authenticate(token)
    await auth.api_keys.revoke(key.subject)
    with pytest.raises(Unauthorized, match="revoked"):
        await auth.authenticate(token)


async def test_minted_tokens_verify_on_another_gateway_with_its_audience(backend: Backend) -> None:
    first = Authenticator(backend, audience="pushgate")
    second = Authenticator(backend, audience="pushgate")
    await first.tenants.create("acme")
    _, api_key = await first.api_keys.create("acme", "send:q")
    token, _ = await first.mint_token(await first.authenticate(api_key), "send:q", 60)
    assert jwt.decode(token, options={"verify_signature": False})["aud"] == "pushgate"
    assert (await second.authenticate(token)).scopes == {"send:q"}
    # Both made or found the same per-tenant secret; the second mints tokens the first accepts.
    token2, _ = await second.mint_token(await second.authenticate(api_key), "send:q", 60)
    assert (await first.authenticate(token2)).scopes == {"send:q"}


async def test_removing_the_minting_key_kills_minted_tokens(auth: Authenticator, backend: Backend) -> None:
    key = await auth.authenticate(await new_key(auth, "send:q"))
    token, _ = await auth.mint_token(key, "send:q", 600)
    await auth.jwt_keys.remove("acme", MINTING_KID)
    with pytest.raises(Unauthorized, match="unknown JWT key"):
        await auth.authenticate(token)
    fresh, _ = await auth.mint_token(key, "send:q", 600)
    assert (await auth.authenticate(fresh)).scopes == {"send:q"}
    assert len(await JwtKeyStore(backend).list_for_tenant("acme")) == 1


# Tenants and origins ------------------------------------------------------------


async def test_tenants_and_origins(auth: Authenticator) -> None:
    await auth.tenants.create(
        "acme", ["https://App.Example.com/", "http://localhost:8080", "https://x.io:443"]
    )
    assert await auth.allowed_origins("acme") == [
        "https://app.example.com",
        "http://localhost:8080",
        "https://x.io",
    ]
    assert await auth.origin_allowed("acme", "https://app.example.com")
    assert not await auth.origin_allowed("acme", "https://evil.example.com")
    assert not await auth.origin_allowed("acme", "null")
    assert await auth.allowed_origins("ghost") == []
    await auth.tenants.set_origins("acme", ["https://new.example.com"])
    assert await auth.allowed_origins("acme") == ["https://new.example.com"]
    assert [t.name for t in await auth.tenants.list_all()] == ["acme"]


async def test_tenant_rules(auth: Authenticator) -> None:
    await auth.tenants.create("acme")
    with pytest.raises(InvalidRequest, match="exists"):
        await auth.tenants.create("acme")
    for name in ["", "a/b", "x" * 65, "sp ace"]:
        with pytest.raises(InvalidRequest):
            await auth.tenants.create(name)
    for origin in ["ftp://x", "https://x/path", "x.example.com", "https://u:p@x"]:
        with pytest.raises(InvalidRequest):
            await auth.tenants.create("other", [origin])
    with pytest.raises(NotFound):
        await auth.tenants.set_origins("ghost", [])
