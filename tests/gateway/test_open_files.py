"""A gateway started with a low open-file limit (backend_store/open_files.py).

Every WebSocket is a file descriptor. Under systemd's default soft limit (1024) a gateway
held about a thousand, and past that uvloop accepted each new connection and closed it at
once, with nothing in the log. Found by trying it (session 48): started with a soft limit of
256, the gateway took 237 of 400 WebSockets; the other 163 clients saw the connection close
before the handshake's answer, and HTTP requests failed the same way until some closed.
``pushgate serve`` now raises its soft limit to the hard one, as Go programs (NATS,
Centrifugo) do, and warns at start-up when even the hard limit is low.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.typing import Subprotocol

from gateway.open_files_watch import OpenFilesWatch
from tests.conftest import scaled
from tests.fixtures.process_files import soft_open_file_limit

from .processes import REPO, ServeProcess

CONNECTIONS = 400


def _serve_with_limit(data: Path, soft: int, hard: int) -> ServeProcess:
    # prlimit execs the command: its PID is the gateway's.
    args = ["prlimit", f"--nofile={soft}:{hard}", sys.executable, "-m", "gateway.cli", "serve"]
    return ServeProcess([*args, "--data", str(data), "--port", "0"], cwd=REPO).wait_until_serving(30)


async def test_a_gateway_started_with_a_soft_limit_of_256_serves_400_websockets(tmp_path: Path) -> None:
    gateway = _serve_with_limit(tmp_path / "data", 256, 4096)
    try:
        assert soft_open_file_limit(gateway.proc.pid) == 4096
        headers = {"Authorization": f"Bearer {gateway.key}"}
        async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=scaled(10)) as http:
            assert (await http.put("/v1/queues/jobs", json={})).status_code == 201
            url = gateway.url.replace("http", "ws", 1) + "/v1/ws"
            sockets: list[ClientConnection] = []
            try:
                for i in range(CONNECTIONS):
                    ws = await connect(
                        url, subprotocols=[Subprotocol("pushgate.v1")], additional_headers=headers
                    )
                    sockets.append(ws)
                    await ws.send(orjson.dumps({"op": "subscribe", "queue": "jobs", "id": i}).decode())
                for i, ws in enumerate(sockets):
                    reply = orjson.loads(await asyncio.wait_for(ws.recv(), scaled(10)))
                    assert reply == {"op": "ok", "id": i, "queue": "jobs"}
                # Past 256 descriptors, HTTP is served too, and a push reaches one of the 400.
                sent = await http.post("/v1/queues/jobs/messages", json={"body": "to one of 400"})
                assert sent.status_code == 201, sent.text
                got = await asyncio.wait_for(_first_push(sockets), scaled(10))
                assert got["message"]["body"] == "to one of 400"
            finally:
                await asyncio.gather(*(ws.close() for ws in sockets))
    finally:
        gateway.terminate()
    assert not any("open-file limit is" in line for line in gateway.output)


async def _first_push(sockets: list[ClientConnection]) -> dict[str, Any]:
    waits = [asyncio.ensure_future(ws.recv()) for ws in sockets]
    try:
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        frame: dict[str, Any] = orjson.loads(done.pop().result())
        return frame
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


async def test_a_low_hard_limit_is_named_at_start_up(tmp_path: Path) -> None:
    gateway = _serve_with_limit(tmp_path / "data", 256, 256)
    try:
        assert soft_open_file_limit(gateway.proc.pid) == 256
        warning = [line for line in gateway.output if "open-file limit is 256" in line]
        assert warning and "LimitNOFILE" in warning[0], gateway.output
    finally:
        gateway.terminate()


def test_the_watch_warns_over_80_percent_once_a_minute_and_once_back_under(
    caplog: pytest.LogCaptureFixture,
) -> None:
    open_now, now = [0], [0.0]
    watch = OpenFilesWatch(lambda: open_now[0], 1000, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, "pushgate.gateway")
    for count, at in ((799, 0), (800, 1), (950, 30), (950, 61), (500, 62), (500, 200)):
        open_now[0], now[0] = count, float(at)
        watch.check()
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "800 connections hold 80% of the open-file limit (1000)",
        "950 connections hold 95% of the open-file limit (1000)",
        "500 connections, under 80% of the open-file limit (1000) again",
    ]


async def test_a_gateway_near_its_limit_says_so(tmp_path: Path) -> None:
    gateway = _serve_with_limit(tmp_path / "data", 256, 256)
    try:
        headers = {"Authorization": f"Bearer {gateway.key}"}
        url = gateway.url.replace("http", "ws", 1) + "/v1/ws"
        sockets = [
            await connect(url, subprotocols=[Subprotocol("pushgate.v1")], additional_headers=headers)
            for _ in range(210)  # 82% of 256
        ]
        try:
            line = await asyncio.to_thread(gateway.wait_for_line, "of the open-file limit (256)", 15)
            assert "210 connections hold 82%" in line and "raise the limit" in line, line
        finally:
            await asyncio.gather(*(ws.close() for ws in sockets))
    finally:
        gateway.terminate()
