"""``pushgate admin backup`` and ``restore`` of the embedded store, through the real commands
and real gateways (backend_store/lmdb_store/backup.py; docs/store.md, "Backup and restore").

What an operator relies on: a backup taken while producers send holds every message
acknowledged before it began (and none acked before it); a restore refuses while a gateway
serves the store and changes nothing then; the store a restore replaces is kept; a file
that is not a store backup is refused before anything is touched.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson

from backend_store.encryption import Keyring
from tests.conftest import scaled

from .processes import REPO, serve

QUEUE = "jobs"


def admin(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "admin", "--data", str(data), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )


async def _send(http: httpx.AsyncClient, body: str) -> str:
    answer = await http.post(f"/v1/queues/{QUEUE}/messages", json={"body": body})
    assert answer.status_code == 201, answer.text
    message_id: str = answer.json()["id"]
    return message_id


async def _receive_all(http: httpx.AsyncClient) -> dict[str, str]:
    """Every message the queue hands out (id -> body), each acked."""
    got: dict[str, str] = {}
    while True:
        answer = await http.post(f"/v1/queues/{QUEUE}/receive", json={"max": 100, "wait_s": 0})
        assert answer.status_code == 200, answer.text
        messages: list[dict[str, Any]] = answer.json()["messages"]
        if not messages:
            return got
        got.update({m["id"]: m["body"] for m in messages})
        acked = await http.post(
            f"/v1/queues/{QUEUE}/ack", json={"receipts": [m["receipt"] for m in messages]}
        )
        assert acked.json()["acked"] == len(messages)


def _client(url: str, key: str | None) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=scaled(10))


async def test_a_backup_taken_while_a_producer_sends_restores_every_message_acknowledged_before_it(
    tmp_path: Path,
) -> None:
    first = serve(tmp_path / "first")
    key = first.key
    try:
        async with _client(first.url, key) as http:
            assert (await http.put(f"/v1/queues/{QUEUE}", json={})).status_code == 201
            before = {await _send(http, f"before {i}"): f"before {i}" for i in range(200)}
            # Ten of them received and acked before the backup: gone from it.
            taken = (await http.post(f"/v1/queues/{QUEUE}/receive", json={"max": 10})).json()["messages"]
            await http.post(f"/v1/queues/{QUEUE}/ack", json={"receipts": [m["receipt"] for m in taken]})
            acked = {m["id"] for m in taken}
            # A producer sends on while the backup runs.
            during: dict[str, str] = {}
            stop, sending = asyncio.Event(), asyncio.Event()

            async def produce() -> None:
                i = 0
                while not stop.is_set():
                    during[await _send(http, f"during {i}")] = f"during {i}"
                    i += 1
                    if i == 20:
                        sending.set()

            producer = asyncio.create_task(produce())
            await asyncio.wait_for(sending.wait(), scaled(30))
            backed_up = await asyncio.to_thread(admin, tmp_path / "first", "backup", str(tmp_path / "b.mdb"))
            stop.set()
            await producer
        assert backed_up.returncode == 0, backed_up.stderr
        report = orjson.loads(backed_up.stdout)
        assert report["backup"] == str(tmp_path / "b.mdb") and report["bytes"] > 0
        assert during, "the producer sent nothing while the backup ran"
    finally:
        first.terminate()

    restored = admin(tmp_path / "second", "restore", str(tmp_path / "b.mdb"))
    assert restored.returncode == 0, restored.stderr
    assert orjson.loads(restored.stdout)["replaced"] is None
    second = serve(tmp_path / "second")
    try:
        # The same tenants and keys: the first gateway's admin key works here.
        async with _client(second.url, key) as http:
            got = await _receive_all(http)
            assert await _send(http, "after the restore")
    finally:
        second.terminate()
    expected = {i: body for i, body in before.items() if i not in acked}
    assert {i: got[i] for i in expected if i in got} == expected  # every one, body for body
    assert not acked & got.keys()
    # The rest were sent while it ran: some are in the snapshot, none is made up.
    assert got.keys() - expected.keys() <= during.keys()
    assert all(got[i] == during[i] for i in got.keys() - expected.keys())


async def test_restore_refuses_while_a_gateway_serves_the_store_and_changes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    gateway = serve(data)
    try:
        async with _client(gateway.url, gateway.key) as http:
            assert (await http.put(f"/v1/queues/{QUEUE}", json={})).status_code == 201
            kept = await _send(http, "kept")
            backed_up = admin(data, "backup", str(tmp_path / "b.mdb"))
            assert backed_up.returncode == 0, backed_up.stderr
            await _send(http, "after the backup")
            refused = admin(data, "restore", str(tmp_path / "b.mdb"))
            assert refused.returncode == 1
            assert "open in another process" in refused.stderr and "stop it first" in refused.stderr
            assert sorted(p.name for p in data.iterdir() if p.name.startswith("store")) == ["store"]
            # The gateway serves on, with everything it had.
            assert (await http.get(f"/v1/queues/{QUEUE}")).json()["stats"]["visible"] == 2
            assert kept in (await _receive_all(http))
    finally:
        gateway.terminate()


async def test_a_restore_keeps_the_store_it_replaces(tmp_path: Path) -> None:
    data = tmp_path / "data"
    gateway = serve(data)
    key = gateway.key  # printed by the first start only
    try:
        async with _client(gateway.url, key) as http:
            assert (await http.put(f"/v1/queues/{QUEUE}", json={})).status_code == 201
            in_backup = await _send(http, "in the backup")
            assert admin(data, "backup", str(tmp_path / "b.mdb")).returncode == 0
            only_in_old = await _send(http, "only in the replaced store")
    finally:
        gateway.terminate()
    restored = admin(data, "restore", str(tmp_path / "b.mdb"))
    assert restored.returncode == 0, restored.stderr
    replaced = Path(orjson.loads(restored.stdout)["replaced"])
    assert replaced.parent == data and replaced.name.startswith("store.before-restore-")
    assert (replaced / "data.mdb").is_file()
    audit = "".join(p.read_text() for p in (data / "audit").rglob("*.jsonl"))
    assert '"action":"store.backed_up"' in audit and '"action":"store.restored"' in audit
    gateway = serve(data)
    try:
        async with _client(gateway.url, key) as http:
            assert set(await _receive_all(http)) == {in_backup}
    finally:
        gateway.terminate()
    # The replaced store is whole: put back (its file restores as a backup's), it serves
    # what it had.
    again = admin(data, "restore", str(replaced / "data.mdb"))
    assert again.returncode == 0, again.stderr
    assert orjson.loads(again.stdout)["replaced"] != str(replaced)
    gateway = serve(data)
    try:
        async with _client(gateway.url, key) as http:
            assert set(await _receive_all(http)) == {in_backup, only_in_old}
    finally:
        gateway.terminate()


def test_bad_backups_and_restores_are_refused_before_anything_is_touched(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    # Nothing to back up yet.
    missing = admin(data, "backup", str(tmp_path / "b.mdb"))
    assert missing.returncode == 1 and "no store at" in missing.stderr
    # Not a store.
    junk = tmp_path / "junk.mdb"
    junk.write_bytes(b"not an LMDB file" * 1000)
    refused = admin(data, "restore", str(junk))
    assert refused.returncode == 1 and "not a store backup" in refused.stderr, refused.stderr
    assert list(data.iterdir()) == []
    # A backup never overwrites a file.
    taken = tmp_path / "taken.mdb"
    taken.write_bytes(b"someone else's")
    (data / "store").mkdir()
    gateway = serve(data)
    gateway.terminate()
    exists = admin(data, "backup", str(taken))
    assert exists.returncode == 1 and "never overwrites" in exists.stderr
    assert taken.read_bytes() == b"someone else's"
    # A cluster is not backed up this way (nothing is dialled to say so).
    cluster = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "admin", "--store", "cluster://127.0.0.1:1", "backup", "x.mdb"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert cluster.returncode == 1 and "embedded store" in cluster.stderr, cluster.stderr


async def test_an_encrypted_stores_backup_stays_sealed_and_restores_with_its_keys(tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(Keyring.generate_document("k1"))
    data = tmp_path / "data"
    gateway = serve(data, "--encryption-key-file", str(keys))
    key = gateway.key
    try:
        async with _client(gateway.url, key) as http:
            assert (await http.put(f"/v1/queues/{QUEUE}", json={})).status_code == 201
            sent = await _send(http, "a secret body")
            # The backup is taken without the keys: it copies sealed bytes as they are.
            taken = admin(data, "backup", str(tmp_path / "b.mdb"))
            assert taken.returncode == 0, taken.stderr
    finally:
        gateway.terminate()
    assert b"a secret body" not in (tmp_path / "b.mdb").read_bytes()
    restored = tmp_path / "restored"
    assert admin(restored, "restore", str(tmp_path / "b.mdb")).returncode == 0
    # Without its keys the restored store does not start, and says why.
    keyless = _serve_until_it_exits(restored)
    assert keyless.returncode != 0 and "holds encrypted data" in keyless.stdout + keyless.stderr
    gateway = serve(restored, "--encryption-key-file", str(keys))
    try:
        async with _client(gateway.url, key) as http:
            assert await _receive_all(http) == {sent: "a secret body"}
    finally:
        gateway.terminate()


def _serve_until_it_exits(data: Path) -> subprocess.CompletedProcess[str]:
    """``pushgate serve`` that is expected to stop at start."""
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--data", str(data), "--port", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
