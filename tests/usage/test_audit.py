"""The audit log: one fsynced JSON line per admin action (the gateway's records of the moment
share one write and fsync); a torn last line is skipped."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from backend_store.types import TenantId
from gateway.auth.principal import Principal
from gateway.cli import main as cli_main
from gateway.usage.audit import AuditAction, AuditLog, audit_request, read_audit

WHEN = dt.datetime(2026, 11, 20, 23, 59, 59, 500000, tzinfo=dt.UTC).timestamp()


def test_records_who_what_when(tmp_path: Path) -> None:
    log = AuditLog(tmp_path, clock=lambda: WHEN)
    entry = log.record(
        log.entry("key:k1", "http", "acme", AuditAction.QUEUE_CREATED, "orders", {"visibility_timeout_s": 30})
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
            log.record(
                log.entry(f"cli:w{worker}", "cli", "acme", AuditAction.KEY_REVOKED, f"key-{worker}-{i}")
            )

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


class CountedSyncs:
    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.fail:
            raise OSError(28, "No space left on device")
        os.fsync(fd)


async def test_records_made_at_once_share_one_write_and_one_fsync(tmp_path: Path) -> None:
    syncs = CountedSyncs()
    log = AuditLog(tmp_path, clock=lambda: WHEN, sync=syncs)
    entries = [log.entry("key:k", "http", "acme", AuditAction.QUEUE_CREATED, f"inbox-{i}") for i in range(64)]
    await asyncio.gather(*(log.append(e) for e in entries))
    # Every caller was answered after its record was written and synced: here all 64 were
    # waiting before the writer's first turn, so one fsync holds them all.
    assert syncs.calls == 1
    assert read_audit(tmp_path).records == entries
    # A record that comes while a batch is being written goes in the next one.
    later = [log.entry("key:k", "http", "acme", AuditAction.QUEUE_DELETED, f"inbox-{i}") for i in range(2)]
    first = asyncio.create_task(log.append(later[0]))
    await asyncio.sleep(0)  # the writer took the first alone
    await asyncio.gather(first, log.append(later[1]))
    assert syncs.calls == 3 and read_audit(tmp_path).records == entries + later


async def test_a_batch_that_cannot_be_written_fails_each_caller_and_the_next_is_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    syncs = CountedSyncs(fail=True)
    log = AuditLog(tmp_path, clock=lambda: WHEN, sync=syncs)
    entries = [log.entry("key:k", "http", "acme", AuditAction.QUEUE_CREATED, f"q{i}") for i in range(3)]
    answers = await asyncio.gather(*(log.append(e) for e in entries), return_exceptions=True)
    assert [type(a) for a in answers] == [OSError] * 3
    # Through the gateway's helper the action stands: the failure is logged, not raised.
    principal = Principal(TenantId("acme"), frozenset(), "k1")
    await audit_request(log, principal, AuditAction.QUEUE_DELETED, "q0")
    assert "could not write the audit record" in caplog.text
    syncs.fail = False
    # A record that cannot be serialised fails alone; the others of the moment are written.
    bad = log.entry("key:k", "http", "acme", AuditAction.QUEUE_UPDATED, "q1", {"when": object()})
    good = log.entry("key:k", "http", "acme", AuditAction.QUEUE_UPDATED, "q2")
    alone = await asyncio.gather(log.append(bad), log.append(good), return_exceptions=True)
    assert isinstance(alone[0], TypeError) and alone[1] is None
    assert [r.target for r in read_audit(tmp_path).records][-1] == "q2"


def test_the_days_directory_moved_away_is_made_again(tmp_path: Path) -> None:
    log = AuditLog(tmp_path, clock=lambda: WHEN)
    log.record(log.entry("cli:op", "cli", "acme", AuditAction.KEY_REVOKED, "k1"))
    (tmp_path / "date=2026-11-20").rename(tmp_path / "shipped")  # an operator shipping the day
    log.record(log.entry("cli:op", "cli", "acme", AuditAction.KEY_REVOKED, "k2"))
    assert [r.target for r in read_audit(tmp_path).records] == ["k2"]


def test_pushgate_admin_commands_are_audited(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Through the real entry point: every changing command leaves one record, reads none,
    and the printed output is what the command always printed."""
    data = tmp_path / "data"
    data.mkdir()

    def admin(*argv: str) -> dict[str, Any]:
        assert cli_main(["admin", "--data", str(data), *argv]) == 0
        out: dict[str, Any] = orjson.loads(capsys.readouterr().out)
        return out

    admin("tenant", "create", "acme", "--origin", "https://app.acme.test")
    created = admin("key", "create", "--tenant", "acme", "--scope", "send:*")
    admin("key", "list", "--tenant", "acme")
    assert admin("key", "revoke", created["key_id"]) == {"revoked": created["key_id"]}
    records = read_audit(data / "audit").records
    assert [(r.action, r.tenant, r.target, r.details, r.source) for r in records] == [
        ("tenant.created", "acme", "acme", {"origins": ["https://app.acme.test"]}, "cli"),
        ("key.created", "acme", created["key_id"], {"scopes": ["send:*"]}, "cli"),
        ("key.revoked", "acme", created["key_id"], {}, "cli"),
    ]
    assert all(r.actor.startswith("cli:") for r in records)
    audit_text = "".join(p.read_text() for p in (data / "audit").rglob("*.jsonl"))
    assert created["key"] not in audit_text  # never a secret
