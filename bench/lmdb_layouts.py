"""What LMDB costs a message on disk: one record per message (the store's layout) against one
record per batch (a layout the store does not have), with and without a replication log.

Run: ``python bench/lmdb_layouts.py [--batch 50] [--rounds 400] [--size 1024] [--repeat 3]``

A design experiment for issue 25, not a benchmark of the product: raw ``lmdb`` calls in one
thread, opened as the embedded store opens its environment (``sync`` on, ``metasync`` off),
in a directory on the disk the store would use (``--dir``, default the system's temporary
directory; never ``/dev/shm``, whose syncs cost nothing). Each round commits ``--batch``
sends, then ``--batch`` acks of the oldest messages, over a standing backlog of 2,000. A
send writes the message's body and an expiry index entry; an ack deletes both; each commit
rewrites the queue's record.

- ``message``: a record per message, as ``backend_store/lmdb_store`` keeps them.
- ``batch``: one record per batch of messages (their bodies side by side), one index entry,
  and the acks of a batch as one small record before the batch goes.
- ``bodies``: the middle way (session 47): each message keeps its small record and index
  entry, but the bodies of a batch share one record, with a count of the messages still
  using it; the last ack of a batch deletes it.
- ``+log``: each commit also appends an entry to a replication log, as a cluster node does:
  the mutations with their values, and the before-images an ack deletes (truncation undoes
  them), the oldest entry past 1,000 trimmed.

Prints the process's CPU time (LMDB and its syncs) and wall time per message for each
layout, and the batch layout's ratio to the per-message one.
"""

from __future__ import annotations

import argparse
import os
import resource
import struct
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import lmdb
import msgpack

_KEY = struct.Struct(">QQ")
_EXPIRY = struct.Struct(">QQQ")
_LSN = struct.Struct(">Q")
_BACKLOG = 2000
_LOG_KEPT = 1000
_MSGS, _EXPIRY_DB = 3, 10  # the store's Db numbers, as a log entry names them
_BODIES = 11  # a database the store does not have


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Result:
    cpu_us: float
    wall_us: float


class Layout:
    def __init__(self, path: str, *, kind: str, logged: bool, body: bytes) -> None:
        self.env = lmdb.open(path, map_size=8 << 30, max_dbs=8, sync=True, metasync=False)
        self.msgs = self.env.open_db(b"msgs")
        self.expiry = self.env.open_db(b"expiry")
        self.queues = self.env.open_db(b"queues")
        self.acked = self.env.open_db(b"acked")
        self.replog = self.env.open_db(b"replog")
        self.bodies = self.env.open_db(b"bodies")
        self.kind, self.per_batch, self.logged, self.body = kind, kind == "batch", logged, body
        self.tail = self.head = self.lsn = 0

    def send(self, n: int) -> None:
        if self.kind == "bodies":
            self._send_bodies(n)
            return
        mutations: list[list[Any]] = []
        with self.env.begin(write=True) as txn:
            for value in [self.body * n] if self.per_batch else [self.body] * n:
                self.tail += 1
                key = _KEY.pack(1, self.tail)
                expiry = _EXPIRY.pack(10**9 + self.tail, 1, self.tail)
                txn.put(key, value, db=self.msgs)
                txn.put(expiry, b"", db=self.expiry)
                mutations += [[_MSGS, key, value], [_EXPIRY_DB, expiry, b""]]
            self._finish(txn, mutations, [])

    def _send_bodies(self, n: int) -> None:
        mutations: list[list[Any]] = []
        with self.env.begin(write=True) as txn:
            batch_key = _LSN.pack(self.tail + 1)
            bodies = self.body * n
            txn.put(batch_key, bodies, db=self.bodies)
            txn.put(b"n" + batch_key, _LSN.pack(n), db=self.bodies)
            mutations += [[_BODIES, batch_key, bodies], [_BODIES, b"n" + batch_key, _LSN.pack(n)]]
            for i in range(n):
                self.tail += 1
                key = _KEY.pack(1, self.tail)
                # Where its body is, and the rest of a message record's small fields.
                record = batch_key + _KEY.pack(i * len(self.body), len(self.body)) + bytes(24)
                expiry = _EXPIRY.pack(10**9 + self.tail, 1, self.tail)
                txn.put(key, record, db=self.msgs)
                txn.put(expiry, b"", db=self.expiry)
                mutations += [[_MSGS, key, record], [_EXPIRY_DB, expiry, b""]]
            self._finish(txn, mutations, [])

    def _ack_bodies(self, n: int) -> None:
        mutations: list[list[Any]] = []
        undo: list[list[Any]] = []
        acked: dict[bytes, int] = {}
        with self.env.begin(write=True) as txn:
            for _ in range(n):
                self.head += 1
                key = _KEY.pack(1, self.head)
                expiry = _EXPIRY.pack(10**9 + self.head, 1, self.head)
                old = txn.pop(key, db=self.msgs)
                assert old is not None
                txn.delete(expiry, db=self.expiry)
                acked[old[:8]] = acked.get(old[:8], 0) + 1
                mutations += [[_MSGS, key, None], [_EXPIRY_DB, expiry, None]]
                undo += [[_MSGS, key, old], [_EXPIRY_DB, expiry, b""]]
            for batch_key, count in acked.items():
                count_key = b"n" + batch_key
                held = txn.get(count_key, db=self.bodies)
                assert held is not None
                left = int.from_bytes(held, "big") - count
                if left:
                    txn.put(count_key, _LSN.pack(left), db=self.bodies)
                    mutations.append([_BODIES, count_key, _LSN.pack(left)])
                    continue
                undo.append([_BODIES, batch_key, txn.pop(batch_key, db=self.bodies)])
                txn.delete(count_key, db=self.bodies)
                mutations += [[_BODIES, batch_key, None], [_BODIES, count_key, None]]
            self._finish(txn, mutations, undo)

    def ack(self, n: int) -> None:
        if self.kind == "bodies":
            self._ack_bodies(n)
            return
        mutations: list[list[Any]] = []
        undo: list[list[Any]] = []
        with self.env.begin(write=True) as txn:
            for _ in range(1 if self.per_batch else n):
                self.head += 1
                key = _KEY.pack(1, self.head)
                if self.per_batch:  # the batch's acks, then the batch with its last one
                    txn.put(key, b"\xff" * (n // 8 + 1), db=self.acked)
                    txn.delete(key, db=self.acked)
                expiry = _EXPIRY.pack(10**9 + self.head, 1, self.head)
                old = txn.pop(key, db=self.msgs)
                txn.delete(expiry, db=self.expiry)
                mutations += [[_MSGS, key, None], [_EXPIRY_DB, expiry, None]]
                undo += [[_MSGS, key, old], [_EXPIRY_DB, expiry, b""]]
            self._finish(txn, mutations, undo)

    def _finish(self, txn: Any, mutations: list[list[Any]], undo: list[list[Any]]) -> None:
        txn.put(b"q1", _KEY.pack(self.tail, self.head), db=self.queues)
        if self.logged:
            self.lsn += 1
            entry = msgpack.packb([self.lsn, msgpack.packb(mutations), undo])
            txn.put(_LSN.pack(self.lsn), entry, db=self.replog)
            if self.lsn > _LOG_KEPT:
                txn.delete(_LSN.pack(self.lsn - _LOG_KEPT), db=self.replog)

    def run(self, batch: int, rounds: int) -> Result:
        for _ in range(_BACKLOG // batch):
            self.send(batch)
        cpu, wall = _cpu(), time.perf_counter()
        for _ in range(rounds):
            self.send(batch)
            self.ack(batch)
        n = rounds * batch
        return Result((_cpu() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=50, help="messages per commit")
    parser.add_argument("--rounds", type=int, default=400, help="send and ack commits, measured")
    parser.add_argument("--size", type=int, default=1024, help="body bytes")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each layout, alternating")
    parser.add_argument("--dir", default=None, help="where the environments go (on disk)")
    args = parser.parse_args()
    body = os.urandom(args.size)
    print(f"{args.batch} messages a commit, {args.size} B bodies, fsync per commit, {args.repeat} runs")
    print(f"{'layout':14s} {'CPU us/msg':>18s} {'wall us/msg':>18s}  CPU against message")
    kinds = ("message", "batch", "bodies")
    for logged in (False, True):
        figures: dict[str, list[Result]] = {kind: [] for kind in kinds}
        for _ in range(args.repeat):
            for kind in kinds:
                with tempfile.TemporaryDirectory(dir=args.dir, prefix="pushgate-layouts-") as tmp:
                    layout = Layout(tmp, kind=kind, logged=logged, body=body)
                    figures[kind].append(layout.run(args.batch, args.rounds))
                    layout.env.close()
        for kind in kinds:
            name = kind + ("+log" if logged else "")
            cpu = [r.cpu_us for r in figures[kind]]
            wall = [r.wall_us for r in figures[kind]]
            ratio = ""
            if kind != "message":
                ratios = [b.cpu_us / m.cpu_us for b, m in zip(figures[kind], figures["message"], strict=True)]
                ratio = f"  {min(ratios):.2f}-{max(ratios):.2f}x"
            print(
                f"{name:14s} {min(cpu):8.1f}-{max(cpu):<8.1f}  {min(wall):8.1f}-{max(wall):<8.1f}{ratio}",
                flush=True,
            )


if __name__ == "__main__":
    main()
