"""The ``pushgate`` command and the server around the app: settings, bootstrap, TLS,
encryption at rest, graceful shutdown, and the README's first command from a clean clone."""

from __future__ import annotations

import json
import re
import signal
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import lmdb
import pytest

from backend_store.encryption import Keyring
from backend_store.errors import ConfigurationError
from backend_store.lmdb_store.engine import STORE_FORMAT
from backend_store.lmdb_store.environment import Db
from gateway.cli import main
from gateway.settings import Settings
from tests.conftest import scaled
from tests.fixtures.certificates import Pair

from .conftest import start_gateway
from .processes import REPO, ServeProcess, serve

# The gateway process itself and the embedded store's files: no test here takes a store URL,
# so the cluster pass of scripts/test would only run them again unchanged.
pytestmark = pytest.mark.embedded_only


def test_settings_flags_win_over_environment(tmp_path: Path) -> None:
    env = {"PUSHGATE_DATA_DIR": str(tmp_path), "PUSHGATE_PORT": "9001", "PUSHGATE_HOST": "0.0.0.0"}
    s = Settings.from_sources({"port": 9002, "host": None}, env)
    assert (s.data_dir, s.port, s.host) == (tmp_path, 9002, "0.0.0.0")
    assert s.resolved_store_url == f"lmdb://{(tmp_path / 'store').resolve()}"
    assert (
        Settings.from_sources({"data_dir": tmp_path, "store_url": "lmdb:///x"}, {}).resolved_store_url
        == "lmdb:///x"
    )


def test_settings_reject_bad_combinations(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError):
        Settings.from_sources({}, {})
    with pytest.raises(ConfigurationError):
        Settings.from_sources({"data_dir": tmp_path, "tls_cert": tmp_path / "c.pem"}, {})
    with pytest.raises(ConfigurationError):
        Settings.from_sources({"data_dir": tmp_path}, {"PUSHGATE_PORT": "eighty"})


def test_settings_keyring_from_file_or_environment(tmp_path: Path) -> None:
    doc = Keyring.generate_document("k9")
    (tmp_path / "keys.json").write_text(doc)
    from_file = Settings.from_sources(
        {"data_dir": tmp_path, "encryption_key_file": tmp_path / "keys.json"}, {}
    )
    from_env = Settings.from_sources({"data_dir": tmp_path}, {"PUSHGATE_ENCRYPTION_KEYS": doc})
    for s in (from_file, from_env):
        keyring = s.keyring()
        assert keyring is not None and keyring.active == "k9"
    assert doc not in repr(from_env)
    assert Settings(data_dir=tmp_path).keyring() is None


def test_cli_usage_and_bad_key_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert main(["frobnicate"]) == 2
    (tmp_path / "bad.json").write_text("{}")
    assert main(["serve", "--data", str(tmp_path), "--encryption-key-file", str(tmp_path / "bad.json")]) == 2
    assert "bad encryption key document" in capsys.readouterr().err


def test_a_store_that_cannot_be_opened_is_said_in_one_line(tmp_path: Path) -> None:
    """An operator whose gateway cannot open its store (here: one a newer version wrote)
    reads why in one line, not in a traceback, and the exit status says start-up failed."""
    env = lmdb.open(str(tmp_path / "store"), max_dbs=len(Db))
    with env.begin(write=True, db=env.open_db(b"meta")) as txn:
        txn.put(b"\0sys\0format", (STORE_FORMAT + 1).to_bytes(8, "big"))
    env.close()
    args = [sys.executable, "-m", "gateway.cli", "serve", "--data", str(tmp_path), "--port", "0"]
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=scaled(60), check=False)
    assert done.returncode == 3
    assert f"cannot start: store {tmp_path / 'store'} was written by a newer Pushgate" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    pair = Pair("127.0.0.1", days=1)
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(pair.cert_pem)
    key_path.write_bytes(pair.key_pem)
    return cert_path, key_path


def test_tls_termination(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    gw = start_gateway(tmp_path / "data", tls_cert=cert, tls_key=key)
    try:
        assert gw.url.startswith("https://")
        headers = {"Authorization": f"Bearer {gw.admin_key}"}
        with httpx.Client(
            base_url=gw.url, verify=ssl.create_default_context(cafile=cert), headers=headers
        ) as client:
            assert client.get("/healthz").json() == {"status": "ok"}
            assert client.put("/v1/queues/tls").status_code == 201
            assert client.post("/v1/queues/tls/messages", json={"body": "secret"}).status_code == 201
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{gw.url}/healthz")  # the default trust store does not know our certificate
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.get(gw.url.replace("https://", "http://") + "/healthz")
    finally:
        gw.stop()


def _store_bytes(data_dir: Path) -> bytes:
    return b"".join(p.read_bytes() for p in (data_dir / "store").iterdir() if p.is_file())


def test_encryption_at_rest(tmp_path: Path) -> None:
    marker = "plaintext-marker-7f3a9c"
    for encrypted in (False, True):
        data_dir = tmp_path / f"enc-{encrypted}"
        keys = Keyring.generate_document() if encrypted else None  # None: the default, unencrypted
        gw = start_gateway(data_dir, encryption_keys=keys)
        try:
            headers = {"Authorization": f"Bearer {gw.admin_key}"}
            with httpx.Client(base_url=gw.url, headers=headers) as client:
                client.put("/v1/queues/secrets")
                assert client.post("/v1/queues/secrets/messages", json={"body": marker}).status_code == 201
                (m,) = client.post("/v1/queues/secrets/receive", json={}).json()["messages"]
                assert m["body"] == marker
        finally:
            gw.stop()
        assert (marker.encode() in _store_bytes(data_dir)) is not encrypted


def test_serve_bootstraps_once_and_stops_gracefully(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    proc = serve(data_dir)
    try:
        assert proc.key is not None
        key_file = data_dir / "bootstrap-admin-key"
        assert key_file.read_text().strip() == proc.key
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        headers = {"Authorization": f"Bearer {proc.key}"}
        with httpx.Client(base_url=proc.url, headers=headers, timeout=scaled(30)) as client:
            client.put("/v1/queues/drain")
            assert client.post("/v1/queues/drain/messages", json={"body": "kept"}).status_code == 201
            client.put("/v1/queues/idle")
            # A long-poll in flight when shutdown starts is answered (empty), not cut off.
            answers: list[httpx.Response] = []
            poll = threading.Thread(
                target=lambda: answers.append(client.post("/v1/queues/idle/receive", json={"wait_s": 20}))
            )
            poll.start()
            _wait_for_in_flight(proc.url, proc.key)
            # docs/http.md: uvicorn re-raises the signal after a clean stop
            assert proc.terminate() == -signal.SIGTERM
            poll.join(scaled(10))
            assert answers and answers[0].status_code == 200 and answers[0].json() == {"messages": []}
    finally:
        proc.stop()
    # The store was closed cleanly: a new server on the same directory has the message
    # and prints no new key.
    again = serve(data_dir)
    try:
        assert again.key is None
        headers = {"Authorization": f"Bearer {key_file.read_text().strip()}"}
        r = httpx.post(f"{again.url}/v1/queues/drain/receive", json={}, headers=headers)
        assert [m["body"] for m in r.json()["messages"]] == ["kept"]
    finally:
        assert again.terminate() == -signal.SIGTERM


def _wait_for_in_flight(url: str, key: str) -> None:
    """Until the gateway reports a long-poll parked (a gauge in /metrics, which needs a token)."""
    deadline = time.monotonic() + scaled(10)
    headers = {"Authorization": f"Bearer {key}"}
    while "pushgate_receive_waiting 1.0" not in httpx.get(f"{url}/metrics", headers=headers).text:
        assert time.monotonic() < deadline, "the long-poll never parked"
        time.sleep(0.01)


@pytest.mark.slow
def test_readme_first_command_from_a_clean_clone(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    command = re.search(r"```sh\n(.*?)\n```", readme, re.S)
    assert command is not None
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    # The command exactly as written; only the port comes from the environment, so the
    # test does not collide with anything on 8080.
    proc = ServeProcess([command.group(1)], cwd=clone, env={"PUSHGATE_PORT": "0"}, shell=True)
    try:
        proc.wait_until_serving(600)
        assert proc.key is not None
        headers = {"Authorization": f"Bearer {proc.key}"}
        with httpx.Client(base_url=proc.url, headers=headers) as client:
            assert client.get("/healthz").json() == {"status": "ok"}
            assert client.put("/v1/queues/readme").status_code == 201
            assert client.post("/v1/queues/readme/messages", json={"body": "hi"}).status_code == 201
            (m,) = client.post("/v1/queues/readme/receive", json={}).json()["messages"]
            assert m["body"] == "hi"
        assert (
            proc.terminate() == -signal.SIGTERM
        )  # docs/http.md: uvicorn re-raises the signal after a clean stop
    finally:
        proc.stop()
    assert (clone / "data" / "bootstrap-admin-key").exists()


def test_admin_command_is_delegated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["admin", "--data", str(tmp_path), "tenant", "create", "acme"]) == 0
    assert json.loads(capsys.readouterr().out)["tenant"] == "acme"
    assert main(["admin", "--data", str(tmp_path), "tenant", "list"]) == 0
    assert "acme" in capsys.readouterr().out


def test_in_flight_requests_get_the_10_s_graceful_timeout(tmp_path: Path) -> None:
    # docs/http.md: on SIGTERM "in-flight requests get 10 s to finish" (the shipped
    # default, `pushgate serve` as run by users). A request whose body never ends stays in
    # flight: the gateway waits the 10 s for it, then stops anyway, with the signal's status.
    proc = serve(tmp_path / "data")
    try:
        assert proc.key is not None
        host, port = proc.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=scaled(30)) as sock:
            sock.sendall(
                (
                    "POST /v1/queues/q/messages HTTP/1.1\r\nHost: test\r\n"
                    f"Authorization: Bearer {proc.key}\r\nContent-Type: application/json\r\n"
                    'Content-Length: 100\r\n\r\n{"body": '
                ).encode()
            )
            _wait_for_a_request_in_flight(proc.url)
            started = time.monotonic()
            status = proc.terminate()
            elapsed = time.monotonic() - started
        assert status == -signal.SIGTERM, "".join(proc.output)
        assert elapsed >= 9.5, f"stopped after {elapsed:.1f} s with a request in flight"
        assert elapsed < 10 + scaled(10), f"stopped only after {elapsed:.1f} s"
    finally:
        proc.stop()


def _wait_for_a_request_in_flight(url: str) -> None:
    """Until the gateway has read the request head sent just before on another connection.

    No metric counts requests in progress; but the gateway's one event loop handles
    sockets in the order they became readable, so once a request made after that head
    was answered, the head was read and the request is in its handler, reading the body."""
    assert httpx.get(f"{url}/healthz", timeout=scaled(10)).status_code == 200
