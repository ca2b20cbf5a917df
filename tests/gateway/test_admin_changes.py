"""Changes made by ``pushgate admin`` in another process reach a running gateway within the
documented 5 s (docs/auth.md, "Caching and when changes take effect"; docs/throttling.md):
a tenant's origins, JWT keys (added and removed), an API key's revocation as seen by the
JWTs minted from it, rate limits and quotas. The CLI runs as its own process on the
gateway's data directory, as an operator runs it; the gateway is the shipped one (5 s caches).

The bound is the point here (docs/testing.md, timing rule 5): each check allows the cache TTL
and :data:`MARGIN_S` for the polls and a loaded machine, counted from the moment the CLI
process has exited, and the revocation checks arrange the stale case on purpose: a token
seen for the first time late in the life of a cached key record.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import jwt
import orjson
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Origin, Subprotocol

from tests.conftest import scaled

from .conftest import RunningGateway
from .processes import admin as run_admin

CACHE_TTL_S = 5.0
# Polls every 0.1 s and a request's round trip: far less than the 5 s a stale cache would add.
MARGIN_S = 1.5
_names = itertools.count()


def admin(gateway: RunningGateway, *args: str) -> dict[str, Any]:
    return run_admin(gateway.settings.data_dir, *args, store_url=gateway.settings.store_url)


def fresh(prefix: str) -> str:
    return f"{prefix}{next(_names)}-{time.monotonic_ns() % 10**6}"


async def within_ttl(changed_at: float, holds: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll until ``holds``; fail if it still does not after the TTL (and margin) since the change."""
    deadline = changed_at + CACHE_TTL_S + scaled(MARGIN_S)
    while not await holds():
        assert time.monotonic() < deadline, f"{what}: not within {CACHE_TTL_S:g} s of the change"
        await asyncio.sleep(0.1)


async def until_late_in_the_cache(primed_at: float) -> None:
    """Sleep until shortly before a record cached at ``primed_at`` expires: a token seen for
    the first time now must not live on past the TTL from the change (a fixed wait, to let
    the wrong outcome show: on correct code it passes however slow the machine)."""
    left = primed_at + CACHE_TTL_S - 0.4 - time.monotonic()
    if left > 0:
        await asyncio.sleep(left)


def bearer(token: str, origin: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {token}"}
    if origin is not None:
        headers["Origin"] = origin
    return headers


async def test_origins_set_by_the_cli_apply_within_5_s(gateway: RunningGateway) -> None:
    tenant = fresh("orig")
    old, new = f"https://{tenant}-old.example", f"https://{tenant}-new.example"
    admin(gateway, "tenant", "create", tenant, "--origin", old)
    key = admin(gateway, "key", "create", "--tenant", tenant, "--scope", "receive:*")["key"]
    async with httpx.AsyncClient(base_url=gateway.url, timeout=scaled(30)) as http:

        async def status(origin: str) -> int:
            return (await http.get("/v1/queues", headers=bearer(key, origin))).status_code

        async def preflight(origin: str) -> int:
            headers = {"Origin": origin, "Access-Control-Request-Method": "POST"}
            return (await http.options("/v1/queues/q/messages", headers=headers)).status_code

        # The gateway has the tenant's record (and the preflight's union) cached now.
        assert (await status(old), await status(new)) == (200, 403)
        assert (await preflight(old), await preflight(new)) == (204, 403)
        admin(gateway, "tenant", "set-origins", tenant, "--origin", new)
        changed = time.monotonic()

        async def swapped() -> bool:
            return (await status(old), await status(new)) == (403, 200)

        async def preflights_swapped() -> bool:
            return (await preflight(old), await preflight(new)) == (403, 204)

        await within_ttl(changed, swapped, "requests from the new origin allowed, the old refused")
        await within_ttl(changed, preflights_swapped, "preflights follow the new origins")
    # A WebSocket is checked against the same rule: it answers from the new origin, and
    # closes with 4003 from the old one.
    assert await ws_from(gateway, key, new) is None
    assert await ws_from(gateway, key, old) == 4003


async def ws_from(gateway: RunningGateway, token: str, origin: str) -> int | None:
    """None if a WebSocket opened from ``origin`` answers a ping, else its close code."""
    async with connect(
        gateway.url.replace("http", "ws", 1) + "/v1/ws",
        subprotocols=[Subprotocol("pushgate.v1")],
        additional_headers={"Authorization": f"Bearer {token}"},
        origin=Origin(origin),
        open_timeout=scaled(10),
    ) as ws:
        try:
            await ws.send(orjson.dumps({"op": "ping", "id": 1}).decode())
            async with asyncio.timeout(scaled(5)):
                async for raw in ws:
                    if orjson.loads(raw) == {"op": "pong", "id": 1}:
                        return None
        except ConnectionClosed:
            pass
        return ws.close_code


def hs256(tenant: str, kid: str, secret: str, scope: str = "receive:*") -> str:
    claims = {
        "sub": fresh("device-"),  # every token its own, so none is in the gateway's token cache
        "tenant": tenant,
        "scope": scope,
        "exp": int(time.time()) + 600,
    }
    return jwt.encode(claims, secret, algorithm="HS256", headers={"kid": kid})


async def test_jwt_keys_added_and_removed_by_the_cli_apply_within_5_s(
    gateway: RunningGateway, tmp_path: Path
) -> None:
    tenant = fresh("jwt")
    admin(gateway, "tenant", "create", tenant)
    secret = "s" * 48
    secret_file = tmp_path / "secret"
    secret_file.write_text(secret)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=scaled(30)) as http:

        async def status(token: str) -> int:
            return (await http.get("/v1/queues", headers=bearer(token))).status_code

        assert await status(hs256(tenant, "k1", secret)) == 401  # no such key yet
        add = ("jwt-key", "add", "--tenant", tenant, "--kid", "k1", "--alg", "HS256")
        admin(gateway, *add, "--secret-file", str(secret_file))
        added = time.monotonic()

        async def accepted() -> bool:
            return await status(hs256(tenant, "k1", secret)) == 200

        await within_ttl(added, accepted, "a token of the added key accepted")
        primed = time.monotonic()  # the key record is cached from here
        admin(gateway, "jwt-key", "remove", "--tenant", tenant, "--kid", "k1")
        removed = time.monotonic()
        await until_late_in_the_cache(primed)
        late = hs256(tenant, "k1", secret)
        await status(late)  # first seen now: verified against the cached key record, if any

        async def refused() -> bool:
            return (await status(late), await status(hs256(tenant, "k1", secret))) == (401, 401)

        await within_ttl(removed, refused, "tokens of the removed key refused")


async def test_tokens_minted_from_a_key_the_cli_revoked_stop_within_5_s(gateway: RunningGateway) -> None:
    tenant = fresh("mint")
    admin(gateway, "tenant", "create", tenant)
    created = admin(gateway, "key", "create", "--tenant", tenant, "--scope", "receive:*")
    async with httpx.AsyncClient(base_url=gateway.url, timeout=scaled(30)) as http:

        async def mint() -> str:
            response = await http.post("/v1/tokens", json={"ttl_s": 600}, headers=bearer(created["key"]))
            assert response.status_code == 201, response.text
            token: str = response.json()["token"]
            return token

        async def status(token: str) -> int:
            return (await http.get("/v1/queues", headers=bearer(token))).status_code

        first = await mint()
        assert await status(first) == 200
        primed = time.monotonic()  # the API key's record is cached from here
        late = await mint()  # not used yet
        admin(gateway, "key", "revoke", created["key_id"])
        revoked = time.monotonic()
        await until_late_in_the_cache(primed)
        await status(late)  # first seen now: checked against the cached key record, if any

        async def refused() -> bool:
            return (await status(late), await status(first), await status(created["key"])) == (401, 401, 401)

        await within_ttl(revoked, refused, "the key and the tokens minted from it refused")


async def test_limits_set_by_the_cli_apply_within_5_s(gateway: RunningGateway) -> None:
    tenant = fresh("lim")
    admin(gateway, "tenant", "create", tenant)
    key = admin(gateway, "key", "create", "--tenant", tenant, "--scope", "admin")["key"]
    queue = "jobs"
    async with httpx.AsyncClient(base_url=gateway.url, timeout=scaled(30), headers=bearer(key)) as http:
        assert (await http.put(f"/v1/queues/{queue}", json={})).status_code == 201

        async def send() -> httpx.Response:
            return await http.post(f"/v1/queues/{queue}/messages", json={"body": "x"})

        ws_url = gateway.url.replace("http", "ws", 1) + "/v1/ws"
        async with connect(
            ws_url,
            subprotocols=[Subprotocol("pushgate.v1")],
            additional_headers={"Authorization": f"Bearer {key}"},
            open_timeout=scaled(10),
        ) as ws:
            ids = itertools.count()

            async def ws_send() -> dict[str, Any]:
                request_id = next(ids)
                await ws.send(
                    orjson.dumps({"op": "send", "queue": queue, "body": "w", "id": request_id}).decode()
                )
                while True:
                    frame: dict[str, Any] = orjson.loads(await asyncio.wait_for(ws.recv(), scaled(10)))
                    if frame.get("id") == request_id:
                        return frame

            # No limits yet, and the gateway has that cached (HTTP and the WebSocket's fast path).
            assert (await send()).status_code == 201
            assert (await ws_send())["op"] == "ok"
            admin(gateway, "limits", "set", "--tenant", tenant, '{"send": "3/hour"}')
            changed = time.monotonic()

            async def http_limited() -> bool:
                return (await send()).status_code == 429

            async def ws_limited() -> bool:
                return (await ws_send()).get("code") == "rate_limited"

            await within_ttl(changed, http_limited, "HTTP sends past the new rate refused")
            await within_ttl(changed, ws_limited, "WebSocket sends past the new rate refused")

            admin(gateway, "limits", "set", "--tenant", tenant, '{"send": null, "max_stored_messages": 1}')
            changed = time.monotonic()

            async def over_quota() -> bool:
                return (await send()).status_code == 409

            async def ws_over_quota() -> bool:
                return (await ws_send()).get("code") == "quota_exceeded"

            await within_ttl(changed, over_quota, "HTTP sends past the new quota refused")
            await within_ttl(changed, ws_over_quota, "WebSocket sends past the new quota refused")


async def test_a_queue_the_cli_deleted_is_refused_to_subscribes_within_5_s(gateway: RunningGateway) -> None:
    """A subscribe reads the queue from the gateway's 5 s queue cache, not the store
    (docs/http.md, "Caches"): one made while the cache still holds a queue deleted elsewhere is
    answered ``ok`` and then ended with ``queue_not_found`` by the dispatcher; once the cache
    has let go, the subscribe itself is refused. No subscription outlives the deletion."""
    tenant = fresh("delq")
    admin(gateway, "tenant", "create", tenant)
    key = admin(gateway, "key", "create", "--tenant", tenant, "--scope", "admin")["key"]
    queue = "gone"
    async with httpx.AsyncClient(base_url=gateway.url, timeout=scaled(30), headers=bearer(key)) as http:
        assert (await http.put(f"/v1/queues/{queue}", json={})).status_code == 201

    async def subscribe() -> str:
        """The code a subscription ends with: ``ok`` if it stands past the TTL and margin."""
        async with connect(
            gateway.url.replace("http", "ws", 1) + "/v1/ws",
            subprotocols=[Subprotocol("pushgate.v1")],
            additional_headers={"Authorization": f"Bearer {key}"},
            open_timeout=scaled(10),
        ) as ws:
            await ws.send(orjson.dumps({"op": "subscribe", "id": 1, "queue": queue}).decode())
            reply = orjson.loads(await asyncio.wait_for(ws.recv(), scaled(10)))
            if reply["op"] == "error":
                return str(reply["code"])
            assert reply == {"op": "ok", "id": 1, "queue": queue}, reply
            try:
                ended = orjson.loads(await asyncio.wait_for(ws.recv(), CACHE_TTL_S + scaled(MARGIN_S)))
            except TimeoutError:
                return "ok"
            assert (ended["op"], ended["id"], ended["queue"]) == ("error", None, queue), ended
            return str(ended["code"])

    assert await subscribe() == "ok"  # the queue is in the gateway's cache now
    admin(gateway, "delete-queue", "--tenant", tenant, queue)
    deleted = time.monotonic()
    # While the cache may still hold it: the subscription is ended, never left standing.
    assert await subscribe() == "queue_not_found"

    async def refused() -> bool:
        async with connect(
            gateway.url.replace("http", "ws", 1) + "/v1/ws",
            subprotocols=[Subprotocol("pushgate.v1")],
            additional_headers={"Authorization": f"Bearer {key}"},
            open_timeout=scaled(10),
        ) as ws:
            await ws.send(orjson.dumps({"op": "subscribe", "id": 1, "queue": queue}).decode())
            reply = orjson.loads(await asyncio.wait_for(ws.recv(), scaled(10)))
            return bool(reply["op"] == "error" and reply["id"] == 1 and reply["code"] == "queue_not_found")

    await within_ttl(deleted, refused, "subscribes to the deleted queue refused")
