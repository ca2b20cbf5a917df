"""The store's Python cost per message, by operation: send, receive, ack.

Run: ``python bench/store_ops.py [--rounds 200] [--batch 100] [--size 1024] [--repeat 3]``

Calls :class:`~backend_store.lmdb_store.message_ops.MessageOps` directly in one thread, one
LMDB transaction per call of ``--batch`` messages, on a RAM-backed directory
(``/dev/shm`` when there is one) and without fsync, and measures the thread's CPU time. It
is what the group-commit writer spends per message besides the commit itself, and the
figure that moves least with the machine's load (end-to-end benchmarks share two cores with
their clients): use it to compare changes to the store's hot paths, run by run.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend_store.lmdb_store import queue_ops
from backend_store.lmdb_store.environment import Environment, Writes
from backend_store.lmdb_store.message_ops import MessageOps
from backend_store.types import NewMessage
from bench.push_common import machine

T = TypeVar("T")


def run(rounds: int, batch: int, size: int) -> dict[str, float]:
    """CPU microseconds per message of each operation."""
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as tmp:
        env = Environment(Path(tmp), 1 << 30, 1 << 34)
        ops = MessageOps(None)

        def write(op: Callable[[Writes], T]) -> T:
            txn = env.begin_write()
            writes = Writes(txn, env.dbs)
            result = op(writes)
            writes.flush_queues()
            txn.commit()
            return result

        write(lambda w: queue_ops.create_queue(w, time.time(), "bench", "q", {}, 1))
        messages = [NewMessage(body=b"x" * size) for _ in range(batch)]
        spent = {"send": 0.0, "receive": 0.0, "ack": 0.0}
        for _ in range(rounds):
            t0 = time.thread_time()
            write(lambda w: ops.send(w, time.time(), "bench", "q", messages))
            t1 = time.thread_time()
            got = write(lambda w: ops.receive(w, time.time(), "bench", "q", batch, 30))
            receipts = [m.receipt for m in got]
            t2 = time.thread_time()
            write(functools.partial(_ack, ops, receipts))
            t3 = time.thread_time()
            if len(got) != batch:
                raise SystemExit(f"received {len(got)} of {batch}")
            spent["send"] += t1 - t0
            spent["receive"] += t2 - t1
            spent["ack"] += t3 - t2
        env.close()
    count = rounds * batch
    return {name: seconds / count * 1e6 for name, seconds in spent.items()}


def _ack(ops: MessageOps, receipts: list[str], w: Writes) -> None:
    ops.settle(w, time.time(), "bench", receipts, None, None)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--batch", type=int, default=100, help="messages per call")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3, help="runs; the best of them is printed")
    args = parser.parse_args()
    print(machine())
    runs = [run(args.rounds, args.batch, args.size) for _ in range(args.repeat)]
    best = min(runs, key=lambda r: sum(r.values()))
    print(
        f"\nstore CPU per message, {args.batch} per call, {args.size} B bodies, no fsync (best of {args.repeat}):"
    )
    for name, us in best.items():
        print(f"  {name:<8} {us:5.1f} us")
    print(f"  {'total':<8} {sum(best.values()):5.1f} us")


if __name__ == "__main__":
    main()
