"""A backup of a store whose serving writer grows its map while the backup begins
(backend_store/lmdb_store/backup.py; docs/store.md, "Backup and restore").

Found by a fresh-clone run: ``pushgate admin backup`` beside a gateway taking sends failed
with ``MDB_MAP_RESIZED`` (tests/gateway/test_backup.py, once in the suite's runs). The backup's
reader mapped py-lmdb's 10 MiB default or the data's end at opening, whichever was larger,
so any page the writer added past that before the copy's read transaction began failed it.
Here the writer is Pushgate's engine in its own process, and it grows the store past any
such map between the backup's opening and its copy: every time, not one run in ten.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from backend_store import StoreOptions, open_backend
from backend_store.lmdb_store.backup import backup, open_reader, restore

from ..conftest import scaled
from .harness import T1, lmdb_url, q, receive_all, send_one

REPO = Path(__file__).resolve().parents[2]
BODY = 256 << 10
# 48 bodies of 256 KiB: 12 MiB, past py-lmdb's default map, from a store made with a 1 MiB map.
GROWN_BY = 48

WRITER = f"""
import asyncio, os, sys
from backend_store import NewMessage, StoreOptions, open_backend
from backend_store.types import QueueName, TenantId

async def main() -> None:
    store = open_backend(sys.argv[1], StoreOptions(map_size=1 << 20, max_map_size=64 << 20))
    await store.start()
    for _ in range({GROWN_BY}):
        await store.send(TenantId({T1!r}), QueueName("big"), [NewMessage(body=os.urandom({BODY}))])
    await store.close()

asyncio.run(main())
"""


async def test_a_backup_adopts_a_map_the_serving_writer_grew_after_the_backup_opened_it(
    tmp_path: Path,
) -> None:
    url = lmdb_url(tmp_path)
    # The wall clock, as the writer's process has: its messages are visible to this one.
    options = StoreOptions(map_size=1 << 20, max_map_size=64 << 20)
    store = open_backend(url, options)
    await store.start()
    await store.create_queue(T1, q("big"), {"max_message_bytes": 1 << 20})
    await send_one(store, T1, "big", b"first")
    await store.close()
    path = tmp_path / "store"

    def open_then_grow(where: Path) -> Any:
        env = open_reader(where)
        subprocess.run([sys.executable, "-c", WRITER, url], cwd=REPO, check=True, timeout=scaled(120))
        return env

    info = backup(path, tmp_path / "b.mdb", open_env=open_then_grow)
    # The copy is of one snapshot taken after the growth: every message is in it.
    restore(info.path, tmp_path / "restored")
    again = open_backend(f"lmdb://{tmp_path / 'restored'}", options)
    await again.start()
    try:
        got = await receive_all(again, T1, "big")
    finally:
        await again.close()
    assert len(got) == 1 + GROWN_BY
