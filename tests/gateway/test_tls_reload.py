"""A renewed TLS certificate is served without a restart (backend_store/tls_reload.py), through real
``pushgate serve`` processes, real TLS clients and a real WebSocket.

What an operator relies on: after certbot (or anyone) replaces the pair, new connections get
the new certificate within the reload interval, or at once on SIGHUP; connections already open
stay open; a pair caught half-written is not loaded (the old one is served on); /metrics says
when the certificate served now expires; and SIGHUP never stops a gateway.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import ssl
import sys
import time
from pathlib import Path

import httpx
import orjson
from websockets.asyncio.client import connect
from websockets.typing import Subprotocol

from tests.conftest import scaled
from tests.fixtures.certificates import Pair
from tests.fixtures.process_files import replace_file

from .processes import REPO, ServeProcess, serve


def _served_certificate(url: str) -> bytes:
    host, port = url.removeprefix("https://").rsplit(":", 1)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # to see whichever certificate is served
    with (
        socket.create_connection((host, int(port)), timeout=scaled(5)) as raw,
        context.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def _wait_for_certificate(url: str, der: bytes, timeout: float) -> None:
    deadline = time.monotonic() + scaled(timeout)
    while _served_certificate(url) != der:
        assert time.monotonic() < deadline, "the new certificate was not served in time"
        time.sleep(0.05)


def _start(tmp_path: Path, first: Pair, interval_s: float) -> tuple[ServeProcess, Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_bytes(first.cert_pem)
    key.write_bytes(first.key_pem)
    args = [sys.executable, "-m", "gateway.cli", "serve", "--data", str(tmp_path / "data"), "--port", "0"]
    args += ["--tls-cert", str(cert), "--tls-key", str(key), "--log-level", "info"]
    env = {"PUSHGATE_TLS_RELOAD_INTERVAL_S": str(interval_s)}
    return ServeProcess(args, cwd=REPO, env=env).wait_until_serving(30), cert, key


def _trusting(*pairs: Pair) -> ssl.SSLContext:
    return ssl.create_default_context(cadata="".join(p.cert_pem.decode() for p in pairs))


def _metrics(url: str, key: str | None, trust: ssl.SSLContext) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {key}"}, verify=trust).text
    wanted = ("pushgate_tls_certificate_expiry_timestamp_seconds", "pushgate_tls_certificate_reloads_total")
    return {
        name: float(value)
        for line in text.splitlines()
        if not line.startswith("#") and (parts := line.split()) and (name := parts[0]) in wanted
        for value in [parts[1]]
    }


async def test_a_renewed_pair_is_served_while_open_websockets_stay_open(tmp_path: Path) -> None:
    old, new = Pair("old", days=30), Pair("new", days=90)
    gateway, cert, key = _start(tmp_path, old, interval_s=0.2)
    trust = _trusting(old, new)
    try:
        assert _served_certificate(gateway.url) == old.der
        assert _metrics(gateway.url, gateway.key, trust) == {
            "pushgate_tls_certificate_expiry_timestamp_seconds": old.not_after.timestamp(),
            "pushgate_tls_certificate_reloads_total": 0.0,
        }
        ws_url = gateway.url.replace("https", "wss", 1) + "/v1/ws"
        headers = {"Authorization": f"Bearer {gateway.key}"}
        async with connect(
            ws_url, ssl=trust, subprotocols=[Subprotocol("pushgate.v1")], additional_headers=headers
        ) as ws:
            # Half a renewal: the new certificate with the old key is no pair, and is not loaded.
            replace_file(cert, new.cert_pem)
            await asyncio.to_thread(gateway.wait_for_line, "not loaded (still serving the previous ones)", 10)
            assert _served_certificate(gateway.url) == old.der
            # The key follows: the pair is loaded, for new connections.
            replace_file(key, new.key_pem)
            await asyncio.to_thread(_wait_for_certificate, gateway.url, new.der, 5)
            # The WebSocket opened before the renewal is still served.
            await ws.send(orjson.dumps({"op": "ping", "id": 1}).decode())
            assert orjson.loads(await asyncio.wait_for(ws.recv(), scaled(5))) == {"op": "pong", "id": 1}
        assert _metrics(gateway.url, gateway.key, trust) == {
            "pushgate_tls_certificate_expiry_timestamp_seconds": new.not_after.timestamp(),
            "pushgate_tls_certificate_reloads_total": 1.0,
        }
    finally:
        assert gateway.terminate() == -signal.SIGTERM
    log = "".join(gateway.output) + "".join(_drain(gateway))
    assert "not loaded (still serving the previous ones)" in log
    assert "TLS certificate reloaded from" in log and "CN=new" in log


def test_sighup_loads_a_renewed_pair_at_once_and_never_stops_a_gateway(tmp_path: Path) -> None:
    old, new = Pair("old", days=30), Pair("new", days=90)
    gateway, cert, key = _start(tmp_path, old, interval_s=3600)  # only SIGHUP looks
    try:
        replace_file(key, new.key_pem)
        replace_file(cert, new.cert_pem)
        assert _served_certificate(gateway.url) == old.der  # nothing looks but SIGHUP
        os.kill(gateway.proc.pid, signal.SIGHUP)
        _wait_for_certificate(gateway.url, new.der, 5)
        os.kill(gateway.proc.pid, signal.SIGHUP)  # nothing changed: still serving
        gateway.wait_for_line("SIGHUP: no TLS file changed", 10)
        assert gateway.proc.poll() is None
        assert _served_certificate(gateway.url) == new.der
    finally:
        gateway.terminate()
    plain = serve(tmp_path / "plain", "--log-level", "info")
    try:
        os.kill(plain.proc.pid, signal.SIGHUP)  # no TLS: nothing to reload, and no exit
        plain.wait_for_line("SIGHUP: no TLS file changed", 10)
        assert plain.proc.poll() is None
        assert httpx.get(f"{plain.url}/healthz").status_code == 200
    finally:
        plain.terminate()


def _drain(gateway: ServeProcess) -> list[str]:
    lines = []
    while not gateway.lines.empty():
        lines.append(gateway.lines.get_nowait())
    return lines
