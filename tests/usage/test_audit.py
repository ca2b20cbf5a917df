"""The audit log: one fsynced JSON line per admin action; a torn last line is skipped."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

from gateway.usage.audit import AuditAction, AuditLog, read_audit

WHEN = dt.datetime(2026, 11, 20, 23, 59, 59, 500000, tzinfo=dt.UTC).timestamp()


def test_records_who_what_when(tmp_path: Path) -> None:
    log = AuditLog(tmp_path, clock=lambda: WHEN)
    entry = log.record(
        "key:k1", "http", "acme", AuditAction.QUEUE_CREATED, "orders", {"visibility_timeout_s": 30}
    )
    read = read_audit(tmp_path)
    assert read.records == [entry] and read.malformed_lines == 0
    assert entry.at == "2026-11-20T23:59:59.500Z"
    assert (tmp_path / "date=2026-11-20" / "audit.jsonl").is_file()
    assert entry.action == "queue.created" and entry.details == {"visibility_timeout_s": 30}


def test_concurrent_appends_never_interleave_and_a_torn_line_is_skipped(tmp_path: Path) -> None:
    log = AuditLog(tmp_path, clock=lambda: WHEN)

    def revoke_many(worker: int) -> None:
        for i in range(50):
            log.record(f"cli:w{worker}", "cli", "acme", AuditAction.KEY_REVOKED, f"key-{worker}-{i}")

    threads = [threading.Thread(target=revoke_many, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(tmp_path / "date=2026-11-20" / "audit.jsonl", "ab") as f:
        f.write(b'{"id": "torn by a cra')  # a crash mid-append
    read = read_audit(tmp_path)
    assert len(read.records) == 200 and read.malformed_lines == 1
    assert len({r.id for r in read.records}) == 200
    assert {r.target for r in read.records} == {f"key-{w}-{i}" for w in range(4) for i in range(50)}
