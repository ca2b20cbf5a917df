"""SIGTERM to a real `pushgate serve`: push connections are drained before uvicorn closes them."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx
import orjson
from websockets.asyncio.client import connect
from websockets.typing import Subprotocol

from tests.conftest import scaled

from .processes import serve


async def test_sigterm_closes_websockets_with_1001_and_releases_their_messages(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    proc = serve(data_dir)
    try:
        assert proc.key is not None
        headers = {"Authorization": f"Bearer {proc.key}"}
        async with httpx.AsyncClient(base_url=proc.url, headers=headers) as http:
            await http.put("/v1/queues/jobs", json={"visibility_timeout_s": 600})
            assert (await http.post("/v1/queues/jobs/messages", json={"body": "held"})).status_code == 201
        ws_url = proc.url.replace("http://", "ws://") + "/v1/ws"
        async with connect(
            ws_url, subprotocols=[Subprotocol("pushgate.v1")], additional_headers=headers
        ) as ws:
            await ws.send(orjson.dumps({"op": "subscribe", "queue": "jobs", "id": 1}).decode())
            frames = [orjson.loads(await asyncio.wait_for(ws.recv(), scaled(10))) for _ in range(2)]
            assert {f["op"] for f in frames} == {"ok", "message"}
            # Held unacked, with 600 s of visibility left, when the server is told to stop.
            proc.proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(ws.wait_closed(), scaled(15))
            assert ws.close_code == 1001
        assert proc.proc.wait(scaled(15)) == -signal.SIGTERM  # the status of the signal (docs/http.md)
    finally:
        proc.stop()
    # Released on the way down, so a restarted gateway hands it out at once.
    again = serve(data_dir)
    try:
        key = (data_dir / "bootstrap-admin-key").read_text().strip()
        async with httpx.AsyncClient(base_url=again.url) as http:
            r = await http.post(
                "/v1/queues/jobs/receive", json={}, headers={"Authorization": f"Bearer {key}"}
            )
        assert [m["body"] for m in r.json()["messages"]] == ["held"]
        assert r.json()["messages"][0]["receive_count"] == 2
    finally:
        again.stop()
