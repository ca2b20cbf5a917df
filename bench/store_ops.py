"""The store's Python cost per message, by operation: send, receive, ack.

Run: ``python bench/store_ops.py [--rounds 200] [--batch 100] [--size 1024] [--repeat 3]
[--written] [--in-flight N] [--churn]``

Calls :class:`~backend_store.lmdb_store.message_ops.MessageOps` directly in one thread, one
LMDB transaction per call of ``--batch`` messages, on a RAM-backed directory
(``/dev/shm`` when there is one) and without fsync, and measures the thread's CPU time. It
is what the group-commit writer spends per message besides the commit itself, and the
figure that moves least with the machine's load (end-to-end benchmarks share two cores with
their clients): use it to compare changes to the store's hot paths, run by run.

Receives are held in memory (``in_memory=True``, as a push subscription's are) unless
``--written``. ``--in-flight N`` first receives N other messages and leaves them unacked for
the whole run (held up to the store's per-queue cap, written past it), to measure what many
messages in flight cost each receive; ``--churn`` also nacks one of them, the oldest left,
before each measured receive (which takes it again): the worst case of the skip hint, each
receive walking past the held ones behind the released one (timed with the receive).
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend_store.lmdb_store import queue_ops
from backend_store.lmdb_store.environment import Environment, Writes
from backend_store.lmdb_store.message_ops import MessageOps
from backend_store.types import NewMessage
from bench.push_common import machine

T = TypeVar("T")


def run(rounds: int, batch: int, size: int, in_memory: bool, in_flight: int, churn: bool) -> dict[str, float]:
    """CPU microseconds per message of each operation."""
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as tmp:
        env = Environment(Path(tmp), 1 << 30, 1 << 34)
        ops = MessageOps(None)

        def write(op: Callable[[Writes], T]) -> T:
            txn = env.begin_write()
            writes = Writes(txn, env.dbs)
            writes.index_listener = ops.holds.indexed  # as the group-commit writer sets it
            result = op(writes)
            writes.flush_queues()
            txn.commit()
            return result

        write(lambda w: queue_ops.create_queue(w, time.time(), "bench", "q", {}, 1))
        messages = [NewMessage(body=b"x" * size) for _ in range(batch)]
        in_flight_receipts: list[str] = []
        for start in range(0, in_flight, batch):
            count = min(batch, in_flight - start)
            write(lambda w: ops.send(w, time.time(), "bench", "q", messages[:count]))  # noqa: B023
            got = write(lambda w: ops.receive(w, time.time(), "bench", "q", count, 3600, in_memory))  # noqa: B023
            in_flight_receipts.extend(m.receipt for m in got)
        spent = {"send": 0.0, "receive": 0.0, "ack": 0.0}
        for i in range(rounds):
            t0 = time.thread_time()
            write(lambda w: ops.send(w, time.time(), "bench", "q", messages))
            t1 = time.thread_time()
            if churn and i < len(in_flight_receipts):
                write(functools.partial(_nack, ops, in_flight_receipts[i]))
            got = write(lambda w: ops.receive(w, time.time(), "bench", "q", batch, 30, in_memory))
            receipts = [m.receipt for m in got]
            t2 = time.thread_time()
            write(functools.partial(_ack, ops, receipts))
            t3 = time.thread_time()
            if len(got) != batch and not churn:
                raise SystemExit(f"received {len(got)} of {batch}")
            spent["send"] += t1 - t0
            spent["receive"] += t2 - t1
            spent["ack"] += t3 - t2
        env.close()
    count = rounds * batch
    return {name: seconds / count * 1e6 for name, seconds in spent.items()}


def _ack(ops: MessageOps, receipts: Sequence[str], w: Writes) -> None:
    ops.settle(w, time.time(), "bench", receipts, None, None)


def _nack(ops: MessageOps, receipt: str, w: Writes) -> None:
    ops.settle(w, time.time(), "bench", [receipt], None, 0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--batch", type=int, default=100, help="messages per call")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3, help="runs; the best of them is printed")
    parser.add_argument("--written", action="store_true", help="write receives (as a plain receive)")
    parser.add_argument("--in-flight", type=int, default=0, help="messages left unacked meanwhile")
    parser.add_argument("--churn", action="store_true", help="release one of those before each receive")
    args = parser.parse_args()
    print(machine())
    runs = [
        run(args.rounds, args.batch, args.size, not args.written, args.in_flight, args.churn)
        for _ in range(args.repeat)
    ]
    best = min(runs, key=lambda r: sum(r.values()))
    mode = "written" if args.written else "held in memory"
    print(
        f"\nstore CPU per message, {args.batch} per call, {args.size} B bodies, no fsync, receives {mode},"
        f" {args.in_flight} others in flight{', one released per receive' if args.churn else ''}"
        f" (best of {args.repeat}):"
    )
    for name, us in best.items():
        print(f"  {name:<8} {us:5.1f} us")
    print(f"  {'total':<8} {sum(best.values()):5.1f} us")


if __name__ == "__main__":
    main()
