"""The child process of test_crash: send many messages concurrently until killed.

Usage: python crash_child.py STORE_DIR ACK_FILE TOTAL PRODUCERS LOG_KEEP

Encryption keys come from ``PUSHGATE_ENCRYPTION_KEYS`` when set; LOG_KEEP is
``StoreOptions.replication_log_keep`` (0: no replication log).

Each producer sends (mostly one message, sometimes a batch of five) and, only after
``send`` returned, appends ``<id> <index>`` to ACK_FILE and flushes it, so the file lists
exactly the messages the store acknowledged. The parent SIGKILLs this process mid-run.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from pathlib import Path

from backend_store import NewMessage, QueueName, SendResult, StoreOptions, TenantId, open_backend
from backend_store.encryption import Keyring

TENANT = TenantId("crash")
QUEUE = QueueName("crash")
PAD = b"." * 200


def body(index: int) -> bytes:
    return f"{index:09d}".encode() + PAD


async def main(store_dir: Path, ack_file: Path, total: int, producers: int, log_keep: int) -> None:
    options = StoreOptions(keyring=Keyring.from_env(), replication_log_keep=log_keep)
    store = open_backend(f"lmdb://{store_dir}", options)
    await store.start()
    counter = itertools.count()
    with ack_file.open("a", encoding="ascii") as acks:

        async def produce(worker: int) -> None:
            while True:
                size = 5 if worker % 4 == 0 else 1
                indexes = [next(counter) for _ in range(size)]
                indexes = [i for i in indexes if i < total]
                if not indexes:
                    return
                results = await store.send(TENANT, QUEUE, [NewMessage(body=body(i)) for i in indexes])
                lines = []
                for index, result in zip(indexes, results, strict=True):
                    if not isinstance(result, SendResult):
                        raise SystemExit(f"send failed: {result!r}")
                    lines.append(f"{result.id} {index}\n")
                # One write(2) per send; the parent still ignores a torn last line.
                acks.write("".join(lines))
                acks.flush()

        await asyncio.gather(*(produce(w) for w in range(producers)))
    await store.close()


if __name__ == "__main__":
    asyncio.run(
        main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    )
