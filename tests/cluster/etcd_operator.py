"""What an operator does to etcd, for the tests of docs/cluster.md's "Backup and restore":
take a snapshot (``etcdctl snapshot save``), lose etcd's data (stop it, remove its data
directory, start it again on the same ports: an empty etcd), and restore a snapshot
(``etcdctl snapshot restore`` into a new data directory, then start etcd on it).

``etcdctl`` comes with Debian's ``etcd-client`` package (``scripts/test`` installs it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.etcd_server import EtcdCluster, EtcdMember


def _timeout(seconds: float) -> float:
    return seconds * float(os.environ.get("PUSHGATE_TEST_TIMEOUT_SCALE", "1"))


def _etcdctl(*args: str) -> str:
    if shutil.which("etcdctl") is None:
        pytest.fail("etcdctl is not installed (Debian package etcd-client; scripts/test installs it)")
    done = subprocess.run(
        ["etcdctl", *args],
        env={**os.environ, "ETCDCTL_API": "3"},
        capture_output=True,
        text=True,
        timeout=_timeout(60),
    )
    assert done.returncode == 0, f"etcdctl {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def snapshot_save(cluster: EtcdCluster, target: Path) -> Path:
    """``etcdctl snapshot save``: the whole keyspace of the (single) member, at one revision."""
    _etcdctl("--endpoints", cluster.members[0].endpoint, "snapshot", "save", str(target))
    return target


def wipe(cluster: EtcdCluster, member: EtcdMember | None = None) -> None:
    """Stop the member, remove its data directory, start it again: an empty etcd."""
    member = member or cluster.members[0]
    cluster.kill_member(member)
    shutil.rmtree(member.data_dir)
    cluster.start_member(member)


def restore(cluster: EtcdCluster, snapshot: Path, member: EtcdMember | None = None) -> None:
    """Stop the member, restore ``snapshot`` as its new data directory, start it."""
    member = member or cluster.members[0]
    cluster.kill_member(member)
    shutil.rmtree(member.data_dir, ignore_errors=True)
    _etcdctl(
        "snapshot",
        "restore",
        str(snapshot),
        "--data-dir",
        str(member.data_dir),
        "--name",
        member.name,
        "--initial-cluster",
        f"{member.name}={member.peer_url}",
        "--initial-cluster-token",
        cluster.token,
        "--initial-advertise-peer-urls",
        member.peer_url,
    )
    cluster.start_member(member)
