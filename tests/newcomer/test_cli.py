"""What a newcomer meets at the command line: --version, bad input in one line, a quiet
Ctrl-C, an access log on request, every PUSHGATE_* variable in ``serve --help``, readable
``admin --help``, a busy port found before anything is written, and 403 wording."""

from __future__ import annotations

import signal
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import get_args

import httpx
import pytest

from gateway.auth.principal import Action
from gateway.cli import _INTERNAL_SETTINGS, main, version
from gateway.routes.access import VERBS
from gateway.settings import Settings
from tests.gateway.conftest import RunningGateway, start_gateway
from tests.gateway.processes import ServeProcess, serve


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"pushgate {version()}\n"
    assert version()[0].isdigit()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("/proc/nope", "--data /proc/nope: cannot create it (No such file or directory)"),
        ("FILE", "not a directory"),
    ],
)
def test_bad_data_dir_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: str, message: str
) -> None:
    if data == "FILE":
        data = str(tmp_path / "a-file")
        Path(data).write_text("not a directory")
    assert main(["serve", "--data", data, "--port", "0"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("pushgate serve: ") and message in captured.err


def test_busy_port_fails_before_a_bootstrap_key_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--data", str(tmp_path / "data"), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err == f"pushgate serve: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    assert list((tmp_path / "data").iterdir()) == []


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_is_a_quiet_drain_and_exit_130(tmp_path: Path, presses: int) -> None:
    # Twice: uvicorn's forced stop, which skips its own lifespan shutdown.
    proc = serve(tmp_path / "data")
    try:
        assert httpx.get(f"{proc.url}/healthz").status_code == 200
        for _ in range(presses):
            proc.proc.send_signal(signal.SIGINT)  # what Ctrl-C sends to the foreground process
            time.sleep(0.02)  # a human's second press comes later still
        assert proc.proc.wait(30) == 130
        proc.stop()  # collects the rest of the output
        rest: list[str] = []
        while not proc.lines.empty():
            rest.append(proc.lines.get())
        output = "".join(proc.output + rest)
        assert "Traceback" not in output and "CancelledError" not in output, output
    finally:
        proc.stop()


def test_access_log_on_request(tmp_path: Path) -> None:
    args = [
        sys.executable,
        "-m",
        "gateway.cli",
        "serve",
        "--data",
        str(tmp_path),
        "--port",
        "0",
        "--access-log",
    ]
    proc = ServeProcess(args).wait_until_serving(30)
    try:
        assert httpx.get(f"{proc.url}/healthz").status_code == 200
        proc.terminate()
        rest = []
        while not proc.lines.empty():
            rest.append(proc.lines.get())
        assert any('"GET /healthz HTTP/1.1" 200' in line for line in rest), rest
    finally:
        proc.stop()


def test_serve_help_lists_every_setting(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for f in fields(Settings):
        if f.name not in _INTERNAL_SETTINGS:
            assert Settings.env_var(f.name) in out, f.name
    for needed in (
        "PUSHGATE_JWT_AUDIENCE",
        "PUSHGATE_MAX_REQUEST_BYTES",
        "PUSHGATE_LOG_LEVEL",
        "--access-log",
    ):
        assert needed in out


def test_admin_help_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["admin", "--help"]) == 0
    out = capsys.readouterr().out
    assert "``" not in out and ":class:" not in out
    assert "pushgate admin --data ./data key create" in out


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    running = start_gateway(tmp_path_factory.mktemp("cli"))
    try:
        yield running
    finally:
        running.stop()


def test_every_action_has_its_wording() -> None:
    assert set(VERBS) == {*get_args(Action), None}


def test_forbidden_wording(gateway: RunningGateway) -> None:
    admin = {"Authorization": f"Bearer {gateway.admin_key}"}
    assert httpx.put(f"{gateway.url}/v1/queues/orders", json={}, headers=admin).status_code == 201
    receiver = {"Authorization": f"Bearer {gateway.make_key('receive:*')}"}
    sent = httpx.post(f"{gateway.url}/v1/queues/orders/messages", json={"body": "x"}, headers=receiver)
    assert sent.status_code == 403
    assert sent.json()["detail"] == "the token's scopes do not allow it to send to queue 'orders'"
    sender = {"Authorization": f"Bearer {gateway.make_key('send:*')}"}
    received = httpx.post(f"{gateway.url}/v1/queues/orders/receive", json={}, headers=sender)
    assert received.json()["detail"] == "the token's scopes do not allow it to receive from queue 'orders'"
