"""``max_pending_requests`` (docs/push.md): at most that many sends/acks/nacks of one
connection wait for the store; past it the server stops reading the socket until answers
come back. Made visible with a store that cannot commit (its write lock held by another
process): a ping behind the bound is not even read, so it is not answered, until the store
moves again; then every send is answered and the ping too."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from backend_store.tested_versions import ReleaseCheck
from tests.conftest import scaled

from .conftest import Http, recv_frame, send_frame, start_push_gateway, ws_connect
from .store_lock import StoreWriteLock

BOUND = 4
# Stalls writes by holding the embedded store's LMDB write lock from another process.
pytestmark = [pytest.mark.embedded_only, pytest.mark.websocket_doors]


async def test_a_connection_past_the_pending_bound_is_not_read(
    tmp_path: Path, websocket_doors: ReleaseCheck
) -> None:
    gateway = start_push_gateway(tmp_path, releases=websocket_doors, max_pending_requests=BOUND)
    try:
        headers = {"Authorization": f"Bearer {gateway.admin_key}"}
        async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=scaled(30)) as client:
            qname = await Http(client).queue("bounded")
            async with ws_connect(gateway, gateway.admin_key) as ws:
                lock = StoreWriteLock(tmp_path / "store")
                with lock:
                    for i in range(BOUND * 3):
                        await send_frame(ws, op="send", queue=qname, body=f"m{i}", id=i)
                    await send_frame(ws, op="ping", id="probe")
                    # Nothing can be answered while the store is blocked: with the bound,
                    # not even the ping, which needs no store (the socket is not read).
                    try:
                        frame = await recv_frame(ws, timeout=1.0)
                    except TimeoutError:
                        frame = None
                    assert frame is None, f"answered while {BOUND} requests were pending: {frame}"
                answered: list[object] = []
                async with asyncio.timeout(scaled(15)):
                    while len(answered) < BOUND * 3 + 1:
                        frame = await recv_frame(ws, timeout=15)
                        answered.append(frame["id"])
                        assert frame["op"] in ("ok", "pong"), frame
                assert set(answered) == {*range(BOUND * 3), "probe"}
    finally:
        gateway.stop()
