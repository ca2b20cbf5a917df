"""The audit log: one record per admin action (who, what, when), never aggregated.

Records are JSON lines under ``<data>/audit/date=YYYY-MM-DD/audit.jsonl`` (UTC date).
Admin actions are rare and each one matters, so every record is appended with one
``write`` on an ``O_APPEND`` descriptor and fsynced before the action is answered: the
gateway and ``pushgate admin`` can append to the same file at once without
interleaving, and an answered action is on disk. The action itself is already done when
its record is written: if the write fails (a full disk) the action stands and the
failure is logged as an error (:func:`audit_request`). A crash mid-append can leave a
partial last line; :func:`read_audit` skips and counts it rather than failing.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import enum
import logging
import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from backend_store.private_files import FILE_MODE, private_dir

from ..auth.principal import Principal

log = logging.getLogger("pushgate.audit")

AUDIT_SUBDIR = "audit"
AUDIT_FILE = "audit.jsonl"


class AuditAction(enum.StrEnum):
    QUEUE_CREATED = "queue.created"
    QUEUE_UPDATED = "queue.updated"  # attributes (limits) changed
    QUEUE_DELETED = "queue.deleted"
    QUEUE_PURGED = "queue.purged"
    KEY_CREATED = "key.created"
    KEY_REVOKED = "key.revoked"
    TENANT_CREATED = "tenant.created"
    TENANT_ORIGINS_CHANGED = "tenant.origins_changed"
    JWT_KEY_ADDED = "jwt_key.added"
    JWT_KEY_REMOVED = "jwt_key.removed"
    LIMITS_CHANGED = "limits.changed"  # a tenant's rate limits and quotas
    NODE_DRAIN_REQUESTED = "node.drain_requested"  # the console asked the managers to drain a node
    NODE_DRAIN_WITHDRAWN = "node.drain_withdrawn"
    STORE_BACKED_UP = "store.backed_up"  # pushgate admin backup
    STORE_RESTORED = "store.restored"  # pushgate admin restore


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One admin action. ``actor`` is who did it: ``key:<key id>`` or ``jwt:<sub>`` for a
    request, ``cli:<os user>`` for ``pushgate admin``; ``source`` is ``http``, ``console``
    (an action in the operator console) or ``cli``;
    ``details`` holds what changed (attributes, scopes), never a secret."""

    id: str
    at: str  # ISO 8601, UTC, milliseconds
    actor: str
    source: str
    tenant: str
    action: str
    target: str
    details: dict[str, Any] = field(default_factory=dict)


def _iso(now: float) -> str:
    return dt.datetime.fromtimestamp(now, tz=dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class AuditLog:
    """Appends :class:`AuditRecord` s under ``root`` (``<data>/audit``). Blocking: from a
    worker thread in the gateway (``asyncio.to_thread``)."""

    def __init__(self, root: Path, clock: Callable[[], float] | None = None) -> None:
        self.root = root
        self.clock = clock

    def record(
        self,
        actor: str,
        source: str,
        tenant: str,
        action: AuditAction,
        target: str,
        details: Mapping[str, Any] | None = None,
    ) -> AuditRecord:
        now = self.clock() if self.clock is not None else dt.datetime.now(dt.UTC).timestamp()
        entry = AuditRecord(
            id=uuid.uuid4().hex,
            at=_iso(now),
            actor=actor,
            source=source,
            tenant=tenant,
            action=str(action),
            target=target,
            details=dict(details or {}),
        )
        directory = self.root / f"date={entry.at[:10]}"
        private_dir(directory)
        line = orjson.dumps(asdict(entry), option=orjson.OPT_SORT_KEYS) + b"\n"
        fd = os.open(directory / AUDIT_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
        try:
            written = os.write(fd, line)
            if written != len(line):  # only on a full disk; the record must not pass as written
                raise OSError(f"audit record cut short ({written} of {len(line)} bytes)")
            os.fsync(fd)
        finally:
            os.close(fd)
        return entry


@dataclass
class AuditRead:
    records: list[AuditRecord]
    malformed_lines: int


def read_audit(root: Path) -> AuditRead:
    """Every audit record under ``root``, in file order (date, then append order)."""
    records: list[AuditRecord] = []
    malformed = 0
    for path in sorted(root.glob(f"date=*/{AUDIT_FILE}")):
        for line in _lines(path):
            try:
                records.append(AuditRecord(**orjson.loads(line)))
            except (orjson.JSONDecodeError, TypeError):
                malformed += 1
    return AuditRead(records, malformed)


def _lines(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                yield line


def actor_of(subject: str, via: str | None) -> str:
    """The ``actor`` of a request's principal: ``key:<id>`` or ``jwt:<sub>``."""
    return f"{'jwt' if via == 'jwt' else 'key'}:{subject}"


def cli_actor() -> str:
    try:
        user = os.getlogin()
    except OSError:
        user = os.environ.get("USER") or str(os.getuid())
    return f"cli:{user}"


async def audit_request(
    audit: AuditLog,
    principal: Principal,
    action: AuditAction,
    target: str,
    details: Mapping[str, Any] | None = None,
    *,
    source: str = "http",
) -> None:
    """Record an admin action made over HTTP, or in the console (``source="console"``), with
    the fsync on a worker thread, off the loop."""
    actor = actor_of(principal.subject, principal.via)
    try:
        await asyncio.to_thread(audit.record, actor, source, principal.tenant, action, target, details)
    except OSError:
        log.exception("could not write the audit record of %s %s/%s", action, principal.tenant, target)
