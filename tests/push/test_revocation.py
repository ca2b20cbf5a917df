"""A revoked API key or a removed JWT signing key ends what is already open: WebSockets
(4001), SSE streams (a close event with 4001) and parked long-polls (401), within the
documented delay, when the change is made by ``pushgate admin`` in another process."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import jwt
import orjson

from tests.conftest import scaled
from tests.gateway.conftest import RunningGateway
from tests.gateway.processes import admin as run_admin

from .conftest import TEST_SETTINGS, Http, closed_with, engine_of, poll, request, sse_stream, ws_connect

# docs/push.md: open connections see a revocation within recheck_interval_s (plus one
# store read); the test allows that and a generous margin for a loaded machine.
DEADLINE_S = TEST_SETTINGS.recheck_interval_s + 4.0


async def parked(gateway: RunningGateway) -> bool:
    return bool(engine_of(gateway).polls.parked)


def admin(gateway: RunningGateway, *args: str) -> dict[str, Any]:
    """``pushgate admin`` as its own process, as an operator would run it."""
    return run_admin(gateway.settings.data_dir, *args, store_url=gateway.settings.store_url)


async def test_revoking_a_key_ends_its_websocket_sse_stream_and_long_poll(
    gateway: RunningGateway, http: Http, qname: str
) -> None:
    await http.queue(qname)
    created = admin(
        gateway, "key", "create", "--tenant", "default", "--scope", f"send:{qname} receive:{qname}"
    )
    key = created["key"]
    async with (
        ws_connect(gateway, key) as ws,
        sse_stream(gateway, qname, key) as sse,
        httpx.AsyncClient(base_url=gateway.url, headers={"Authorization": f"Bearer {key}"}) as client,
    ):
        assert (await request(ws, op="subscribe", queue=qname, id=1))["op"] == "ok"
        assert sse.response.status_code == 200
        long_poll = asyncio.ensure_future(client.post(f"/v1/queues/{qname}/receive", json={"wait_s": 20}))
        await poll(lambda: parked(gateway), what="the long-poll to park")

        admin(gateway, "key", "revoke", created["key_id"])
        revoked_at = time.monotonic()

        assert await closed_with(ws, timeout=DEADLINE_S) == 4001
        assert ws.close_reason == "API key revoked"
        closing = await sse.next(timeout=DEADLINE_S)
        assert closing["event"] == "close"
        assert orjson.loads(closing["data"])["code"] == 4001
        answer = await asyncio.wait_for(long_poll, scaled(DEADLINE_S))
        assert answer.status_code == 401
        assert time.monotonic() - revoked_at < scaled(DEADLINE_S)
        # And plain HTTP refuses the key at once too (the recheck refreshed the caches).
        assert (await client.get(f"/v1/queues/{qname}")).status_code == 401


async def test_removing_a_jwt_signing_key_ends_connections_it_opened(
    gateway: RunningGateway, http: Http, qname: str, tmp_path: Path
) -> None:
    await http.queue(qname)
    secret = tmp_path / "secret"
    secret.write_text("s" * 48)
    kid = f"k-{qname}"
    admin(
        gateway,
        "jwt-key",
        "add",
        "--tenant",
        "default",
        "--kid",
        kid,
        "--alg",
        "HS256",
        "--secret-file",
        str(secret),
    )
    claims = {
        "sub": "device-1",
        "tenant": "default",
        "scope": f"receive:{qname}",
        "exp": int(time.time()) + 600,
    }
    token = jwt.encode(claims, "s" * 48, algorithm="HS256", headers={"kid": kid})
    async with ws_connect(gateway, token) as ws:
        assert (await request(ws, op="subscribe", queue=qname, id=1))["op"] == "ok"
        admin(gateway, "jwt-key", "remove", "--tenant", "default", "--kid", kid)
        assert await closed_with(ws, timeout=DEADLINE_S) == 4001
        assert "removed" in (ws.close_reason or "")


# docs/auth.md: a key revoked by `pushgate admin` in another process stops working over
# plain HTTP "within 5 seconds" (the cache TTL), with nothing open that the recheck sees.
CACHE_TTL_S = 5.0


async def test_http_refuses_a_key_revoked_by_the_cli_within_5_s(gateway: RunningGateway, qname: str) -> None:
    created = admin(gateway, "key", "create", "--tenant", "default", "--scope", f"receive:{qname}")
    headers = {"Authorization": f"Bearer {created['key']}"}
    async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=scaled(30)) as client:
        # The key works and is now in the gateway's caches.
        assert (await client.get("/v1/queues")).status_code == 200
        admin(gateway, "key", "revoke", created["key_id"])
        revoked_at = time.monotonic()
        deadline = revoked_at + scaled(CACHE_TTL_S + 3.0)  # the TTL, and room for a loaded machine
        while (status := (await client.get("/v1/queues")).status_code) == 200:
            assert time.monotonic() < deadline, "the revoked key still works after the cache TTL"
            await asyncio.sleep(0.1)
        assert status == 401
