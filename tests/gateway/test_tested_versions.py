"""Dependencies relied on beyond their public API (docs/http.md): on the releases of uvicorn
and ``websockets`` the WebSocket fast path was tested with the gateway serves with it; on any
other it serves on uvicorn's public protocol, with one warning naming the release and what it
costs, and never refuses to start. ``pyproject.toml`` bounds each below its next major release.
(The push suites run on both doors: tests/push/conftest.py.)"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
import tomllib
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.typing import Subprotocol

from backend_store.cluster.coordination.etcd_tls import TESTED_AETCD
from backend_store.tested_versions import ReleaseCheck, VersionRange
from gateway.ws_protocol import PUBLIC_PROTOCOL, TESTED_UVICORN, TESTED_WEBSOCKETS, websocket_protocol
from gateway.ws_server_protocol import PushWebSocketProtocol
from tests.conftest import scaled
from tests.push.conftest import deliveries, request

from .processes import REPO, ServeProcess, serve

pytestmark = pytest.mark.embedded_only

RELIANCES = [TESTED_UVICORN, TESTED_WEBSOCKETS]


def test_the_installed_versions_are_the_tested_ones() -> None:
    """The suite's own environment runs the fast path (CI's second pass, scripts/test, runs
    the transport tests again on the newest releases, which may take the public doors)."""
    for tested in RELIANCES:
        installed = importlib.metadata.version(tested.distribution)
        assert tested.admits(installed), f"{tested.distribution} {installed} is not {tested.specifier}"
    assert websocket_protocol(ReleaseCheck()) is PushWebSocketProtocol


def _next_major(version: str) -> str:
    """The release a ``<`` bound stops below: 1 for 0.x (SemVer's initial development; for
    uvicorn every 0.x release so far), else the major after it."""
    major = int(version.split(".")[0])
    return str(major + 1)


def test_pyproject_bounds_each_reliance_below_its_next_major_release() -> None:
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for tested in RELIANCES:
        bounds = [
            m.group(1).replace(" ", "")
            for d in dependencies
            if (m := re.fullmatch(rf"{tested.distribution}(?:\[[^]]*\])?(.*)", d))
        ]
        assert bounds == [f">={tested.lowest},<{_next_major(tested.lowest)}"]


def test_the_constraints_scripts_test_installs_are_the_tested_ranges() -> None:
    """scripts/test's main passes run on the tested releases (scripts/tested-releases.txt),
    whatever newer one pip would pick."""
    lines = (REPO / "scripts/tested-releases.txt").read_text().splitlines()
    constraints = [line for line in lines if line and not line.startswith("#")]
    assert constraints == [f"{t.distribution}{t.specifier}" for t in [*RELIANCES, TESTED_AETCD]]


@pytest.mark.parametrize(
    ("version", "admitted"),
    [
        ("0.53.9", False),
        ("0.54", True),
        ("0.54.0", True),
        ("0.54.7", True),
        ("0.55.0rc1", False),
        ("0.55.0", False),
        ("1.0.0", False),
        ("unknown", False),
    ],
)
def test_a_range_admits_from_its_lowest_up_to_below_its_bound(version: str, admitted: bool) -> None:
    tested = VersionRange("uvicorn", "0.54", "0.55", "a reliance", "a cost")
    assert tested.admits(version) is admitted
    assert ReleaseCheck(lambda distribution: version).tested(tested) is admitted


def _installed(**versions: str) -> ReleaseCheck:
    """The process's check as it would be with ``versions`` installed (the rest as they are)."""
    return ReleaseCheck(lambda d: versions.get(d) or importlib.metadata.version(d))


@pytest.mark.parametrize(
    ("tested", "version"),
    [(TESTED_UVICORN, "0.55.0"), (TESTED_UVICORN, "0.53.0"), (TESTED_WEBSOCKETS, "17.5")],
    ids=["uvicorn-newer", "uvicorn-older", "websockets-newer"],
)
def test_an_untested_release_selects_the_public_protocol_and_warns_once(
    caplog: pytest.LogCaptureFixture, tested: VersionRange, version: str
) -> None:
    releases = _installed(**{tested.distribution: version})
    with caplog.at_level(logging.WARNING, "pushgate.dependencies"):
        assert websocket_protocol(releases) == PUBLIC_PROTOCOL
        assert websocket_protocol(releases) == PUBLIC_PROTOCOL
    [warning] = caplog.records
    assert warning.getMessage() == (
        f"{tested.distribution} {version} is not a release this Pushgate was tested with "
        f"({tested.distribution}{tested.specifier}), where {tested.reliance}: WebSockets run on "
        "uvicorn's public websockets-sansio protocol instead, at 15-50% more gateway CPU per "
        f"message with a frame per message (docs/http.md, dependencies; pip install '{tested.distribution}{tested.specifier}' "
        "for the tested one)"
    )


def _fake_distribution(root: Path, name: str, version: str) -> Path:
    """A directory whose metadata says ``name`` ``version`` is installed (first on the path,
    it is what ``importlib.metadata`` finds; the code imported is still the real one)."""
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


async def test_serve_runs_an_untested_release_on_the_public_doors(tmp_path: Path) -> None:
    """``pushgate serve`` with a uvicorn it was not tested with: it starts, says so once, and a
    WebSocket subscriber gets what is sent and acks it (uvicorn's own protocol, the same push
    handler)."""
    fake = _fake_distribution(tmp_path / "site", "uvicorn", "0.99.0")
    env = {"PYTHONPATH": os.pathsep.join([str(fake), str(REPO)])}
    process: ServeProcess = serve(tmp_path / "data", env=env)
    try:
        warnings = [line for line in process.output if "is not a release this Pushgate was tested" in line]
        assert len(warnings) == 1 and "WARNING pushgate.dependencies: uvicorn 0.99.0 is not" in warnings[0]
        assert process.key is not None
        queue = "untested-release"
        headers = {"Authorization": f"Bearer {process.key}"}
        async with httpx.AsyncClient(base_url=process.url, headers=headers, timeout=scaled(30)) as http:
            assert (await http.put(f"/v1/queues/{queue}")).status_code == 201
        url = process.url.replace("http", "ws", 1) + "/v1/ws"
        async with connect(
            url,
            subprotocols=[Subprotocol("pushgate.v1")],
            additional_headers=headers,
            open_timeout=scaled(10),
        ) as ws:
            reply = await request(ws, op="subscribe", queue=queue, id="sub")
            assert reply["op"] == "ok", reply
            sent = await request(ws, op="send", queue=queue, body="on the public doors", id="send")
            assert sent["op"] == "ok", sent
            [message] = await deliveries(ws, 1)
            assert message["body"] == "on the public doors"
            acked = await request(ws, op="ack", receipts=[message["receipt"]], id="ack")
            assert acked["acked"] == 1, acked
    finally:
        process.terminate()
