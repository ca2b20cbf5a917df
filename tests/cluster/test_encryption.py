"""Encryption at rest on backend nodes: ``pushgate node --encryption-key-file``.

Real etcd, three real node processes given the same key document, a queue replicated three
times (sync). A body is sealed on every replica's disk, each replica opens it, and a
follower promoted after the leader's SIGKILL serves it in plain text.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backend_store.encryption import Keyring
from tests.fixtures.etcd_server import unique_prefix

from .processes import ClusterHarness
from .workload import RF3_SYNC, Q, T, has_replicas, replicated_everywhere

MARKER = "plaintext-marker-5c1e2b"


@pytest.fixture
async def harness(etcd_endpoints: list[str], tmp_path: Path) -> AsyncIterator[ClusterHarness]:
    h = ClusterHarness(etcd_endpoints, tmp_path, unique_prefix("encryption") + "/")
    try:
        yield h
    finally:
        await h.close()


def _files_of(root: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(root.rglob("*.mdb")))


async def _on_every_replica(root: Path, nodes: list[str], data: bytes) -> bool:
    return all(data in _files_of(root / name) for name in nodes)


async def test_bodies_are_sealed_on_every_replica_and_open_after_failover(
    harness: ClusterHarness, tmp_path: Path
) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(Keyring.generate_document())
    h = await harness.start(nodes=3, node_args=["--encryption-key-file", str(keys)])
    await h.create_queue(T, Q, RF3_SYNC)
    pid = await h.partition_of(T, Q)
    await h.wait_for("three replicas", lambda: has_replicas(h, pid, 3))
    await h.serving_leader(pid)

    sent = await h.send_until_ok(pid, T, Q, MARKER)
    # The message on every replica (its id is stored in the clear, as SQS keeps ids). Waited
    # for, not taken from the published positions: those can agree on the LSN before the
    # send while the leader has yet to publish its own, and the third replica of a sync
    # write may still be applying it (a fresh clone's run, session 47).
    await h.wait_for(
        "the message's id in every replica's files",
        lambda: _on_every_replica(tmp_path, list(h.nodes), sent.id.encode()),
    )
    await replicated_everywhere(h, pid, list(h.nodes))
    for name in h.nodes:
        # ...and its body only sealed.
        assert MARKER.encode() not in _files_of(tmp_path / name), name
    assert await h.read_queue(pid, T, Q) == [MARKER]

    # A follower promoted opens what the old leader sealed.
    victim, _, epoch = await h.serving_leader(pid)
    h.nodes[victim].kill()
    _, _, new_epoch = await h.serving_leader(pid, not_node=victim)
    assert new_epoch > epoch
    assert await h.read_queue(pid, T, Q) == [MARKER]


def test_a_node_refuses_to_start_with_an_unreadable_key_file(tmp_path: Path) -> None:
    bad = tmp_path / "keys.json"
    bad.write_text("{not json")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "node",
            "--data",
            str(tmp_path / "n"),
            "--etcd",
            "127.0.0.1:1",
            "--encryption-key-file",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("pushgate node: ")
