"""The child process of test_crash: send (and optionally consume) concurrently until killed.

Usage: python crash_child.py STORE_DIR LOG_DIR TOTAL PRODUCERS CONSUMERS LOG_KEEP [held]

Encryption keys come from ``PUSHGATE_ENCRYPTION_KEYS`` when set; LOG_KEEP is
``StoreOptions.replication_log_keep`` (0: no replication log).

Each producer sends (mostly one message, sometimes a batch of five) and, only after ``send``
returned, appends ``<id> <index>`` to LOG_DIR/sent.txt and flushes it, so the file lists
exactly the messages the store acknowledged. Each consumer receives up to ten, logs their ids
to attempts.txt *before* acking and to acked.txt *after* ``ack`` returned: an id in acked.txt
was deleted durably; one only in attempts.txt may or may not have been. The parent SIGKILLs
this process mid-run.

With ``held``, consumers receive in memory (``receive_in_memory``, as push subscriptions do)
and keep up to KEEP_UNACKED of the messages they got unacked until the kill, logged to
kept.txt once received (held, never acked); the rest they ack as above.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from pathlib import Path
from typing import TextIO

from backend_store import NewMessage, QueueName, SendResult, StoreOptions, TenantId, open_backend
from backend_store.backend import InMemoryReceive
from backend_store.encryption import Keyring

TENANT = TenantId("crash")
QUEUE = QueueName("crash")
PAD = b"." * 200
# Longer than any run: a message is delivered once in the child; the parent reads with a clock
# moved past it.
VISIBILITY_S = 3600
# Messages the consumers of a ``held`` run leave unacked (under the store's per-queue cap of
# held messages, so every one of them is held in memory, none written).
KEEP_UNACKED = 300


def body(index: int) -> bytes:
    return f"{index:09d}".encode() + PAD


def log_lines(log: TextIO, lines: list[str]) -> None:
    # One write(2) per call; the parent still ignores a torn last line.
    log.write("".join(lines))
    log.flush()


async def main(
    store_dir: Path, log_dir: Path, total: int, producers: int, consumers: int, log_keep: int, held: bool
) -> None:
    options = StoreOptions(keyring=Keyring.from_env(), replication_log_keep=log_keep)
    store = open_backend(f"lmdb://{store_dir}", options)
    await store.start()
    counter = itertools.count()
    sending = producers
    kept_count = 0
    receive = store.receive
    if held:
        assert isinstance(store, InMemoryReceive)
        receive = store.receive_in_memory
    with (
        (log_dir / "sent.txt").open("a", encoding="ascii") as sent,
        (log_dir / "attempts.txt").open("a", encoding="ascii") as attempts,
        (log_dir / "acked.txt").open("a", encoding="ascii") as acked,
        (log_dir / "kept.txt").open("a", encoding="ascii") as kept,
    ):

        async def produce(worker: int) -> None:
            nonlocal sending
            while True:
                size = 5 if worker % 4 == 0 else 1
                indexes = [i for i in (next(counter) for _ in range(size)) if i < total]
                if not indexes:
                    sending -= 1
                    return
                results = await store.send(TENANT, QUEUE, [NewMessage(body=body(i)) for i in indexes])
                lines = []
                for index, result in zip(indexes, results, strict=True):
                    if not isinstance(result, SendResult):
                        raise SystemExit(f"send failed: {result!r}")
                    lines.append(f"{result.id} {index}\n")
                log_lines(sent, lines)

        async def consume() -> None:
            nonlocal kept_count
            while True:
                got = await receive(TENANT, QUEUE, 10, visibility_timeout_s=VISIBILITY_S)
                if not got:
                    if not sending:
                        return
                    await asyncio.sleep(0.001)  # the producers are ahead of nothing yet
                    continue
                if held and kept_count < KEEP_UNACKED:
                    # Every other one stays held, unacked, until the kill.
                    keep, got = got[::2], got[1::2]
                    kept_count += len(keep)
                    log_lines(kept, [f"{m.id}\n" for m in keep])
                    if not got:
                        continue
                log_lines(attempts, [f"{m.id}\n" for m in got])
                result = await store.ack(TENANT, [m.receipt for m in got])
                if result.failed:
                    raise SystemExit(f"ack failed: {result.failed!r}")
                log_lines(acked, [f"{m.id}\n" for m in got])

        await asyncio.gather(*(produce(w) for w in range(producers)), *(consume() for _ in range(consumers)))
    await store.close()


if __name__ == "__main__":
    store_dir, log_dir, *numbers = sys.argv[1:]
    held = numbers[-1] == "held"
    total, producers, consumers, log_keep = map(int, numbers[:4])
    asyncio.run(main(Path(store_dir), Path(log_dir), total, producers, consumers, log_keep, held))
