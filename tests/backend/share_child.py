"""The child process of test_hold_lock: open a store another process is using, receive
what is visible, print the bodies as a JSON list, close.

Usage: python share_child.py STORE_DIR TENANT QUEUE
"""

from __future__ import annotations

import asyncio
import json
import sys

from backend_store import QueueName, StoreOptions, TenantId, open_backend


async def main(store_dir: str, tenant: str, queue: str) -> None:
    store = open_backend(f"lmdb://{store_dir}", StoreOptions(sweep_interval_s=0))
    await store.start()  # waits until the other process writes what it holds in memory
    try:
        got = await store.receive(TenantId(tenant), QueueName(queue), 10, visibility_timeout_s=300)
        print(json.dumps([m.body.decode() for m in got]), flush=True)
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
