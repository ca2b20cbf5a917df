"""The audit log: one fsynced JSON line per admin action; a torn last line is skipped."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.cli import main as cli_main
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
