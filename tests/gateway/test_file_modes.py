"""Data directories 0700 and files 0600 from birth, whatever the umask, and warnings at start
for what is wider and for AWS secrets kept in clear (issue 47, part 4).

The gateway's part runs a real gateway; a node's data directory is made by the same code a
``pushgate node`` runs (its LMDB environments and its small files)."""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from backend_store.cluster.node.durable_file import write_durably
from backend_store.encryption import Keyring
from backend_store.lmdb_store.environment import Environment
from tests.conftest import scaled

from .conftest import start_gateway


@pytest.fixture(autouse=True)
def open_umask() -> Iterator[None]:
    """The common default umask (0022), which would make files 0644 and directories 0755."""
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _all_under(root: Path) -> list[Path]:
    return [root, *root.rglob("*")]


def test_a_new_data_directory_and_everything_in_it_is_private(tmp_path: Path) -> None:
    data = tmp_path / "parent" / "data"
    gateway = start_gateway(data, usage_flush_interval_s=0.1)
    try:
        headers = {"Authorization": f"Bearer {gateway.admin_key}"}
        assert httpx.put(f"{gateway.url}/v1/queues/q", headers=headers).status_code == 201  # an audit record
        httpx.post(f"{gateway.url}/v1/queues/q/messages", headers=headers, json={"body": "x"})
        deadline = time.monotonic() + scaled(20)
        while not list((data / "usage").rglob("*.parquet")):  # the usage flusher's first file
            assert time.monotonic() < deadline, "no usage file was written"
            time.sleep(0.05)
    finally:
        gateway.stop()
    paths = _all_under(data)
    names = {p.name for p in paths}
    assert {"data.mdb", "lock.mdb", "bootstrap-admin-key", "audit.jsonl"} <= names, names
    assert any(p.suffix == ".parquet" for p in paths)
    for path in paths:
        assert _mode(path) == (0o700 if path.is_dir() else 0o600), (path, oct(_mode(path)))
    assert _mode(tmp_path / "parent") == 0o700  # a missing parent is made private too


def test_a_node_data_directory_is_private(tmp_path: Path) -> None:
    node = tmp_path / "node"
    env = Environment(node / "partitions" / "7", map_size=1 << 20, max_map_size=1 << 20)
    env.close()
    write_durably(node / "node-id", b"n1")
    for path in _all_under(node):
        assert _mode(path) == (0o700 if path.is_dir() else 0o600), (path, oct(_mode(path)))


def test_a_start_warns_of_wider_modes_and_of_aws_secrets_in_clear(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    gateway = start_gateway(data)
    try:
        authenticator = gateway.services.authenticator
        key, _ = gateway.call(authenticator.api_keys.create("default", "send:*"))
        gateway.call(authenticator.aws_keys.create(key.key_id))
    finally:
        gateway.stop()
    os.chmod(data, 0o755)
    os.chmod(data / "store" / "data.mdb", 0o644)
    with caplog.at_level(logging.WARNING, logger="pushgate.gateway"):
        start_gateway(data).stop()
    lines = [r.getMessage() for r in caplog.records if r.name == "pushgate.gateway"]
    assert any(line.startswith(f"{data} is mode 0755") for line in lines), lines
    assert any(line.startswith(f"{data / 'store' / 'data.mdb'} is mode 0644") for line in lines), lines
    assert any("AWS credentials for the SQS API are stored in clear" in line for line in lines), lines
    assert not any("bootstrap-admin-key" in line for line in lines)  # that one is 0600


def test_no_warning_with_private_modes_and_a_keyring(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    keys = Keyring.generate_document()
    gateway = start_gateway(data, encryption_keys=keys)
    try:
        authenticator = gateway.services.authenticator
        key, _ = gateway.call(authenticator.api_keys.create("default", "send:*"))
        gateway.call(authenticator.aws_keys.create(key.key_id))
    finally:
        gateway.stop()
    with caplog.at_level(logging.WARNING, logger="pushgate.gateway"):
        start_gateway(data, encryption_keys=keys).stop()
    assert [r.getMessage() for r in caplog.records if r.name == "pushgate.gateway"] == []
