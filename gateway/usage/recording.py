"""Usage recording as the gateway builds it from :class:`~gateway.settings.Settings`:
the aggregator (a sink of the gateway's observe point, ``push/observer.py``), the
flusher and the audit log.

``GatewayServices.build`` makes one :class:`UsageRecording`; its flusher is the first
component (started first, closed last, so the final flush sees every outcome the push
engine and the routes recorded while shutting down).
"""

from __future__ import annotations

import re
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

from .aggregator import UsageAggregator
from .audit import AUDIT_SUBDIR, AuditLog
from .flusher import UsageFlusher
from .writer import USAGE_SUBDIR, UsageWriter

_UNSAFE = re.compile(r"[^A-Za-z0-9_.]+")


def gateway_id(name: str | None) -> str:
    """``<name>-<random>``: unique per process start, so record ids never collide even
    when two gateways share a name or one restarts within a second."""
    base = _UNSAFE.sub("_", name or socket.gethostname())[:40] or "gateway"
    return f"{base}-{secrets.token_hex(4)}"


@dataclass(eq=False)
class UsageRecording:
    aggregator: UsageAggregator | None
    flusher: UsageFlusher | None
    audit: AuditLog

    @classmethod
    def build(
        cls, data_dir: Path, flush_interval_s: float, name: str | None, usage_dir: Path | None = None
    ) -> UsageRecording:
        """Usage files under ``usage_dir`` (default ``<data_dir>/usage``; several gateways
        may share one, their files are named by gateway id), the audit log under ``data_dir``;
        ``flush_interval_s`` 0 records no usage (no aggregator joins the observe point) but
        still keeps the audit log."""
        audit = AuditLog(data_dir / AUDIT_SUBDIR)
        if flush_interval_s <= 0:
            return cls(None, None, audit)
        aggregator = UsageAggregator()
        writer = UsageWriter(usage_dir or data_dir / USAGE_SUBDIR, gateway_id(name))
        flusher = UsageFlusher(aggregator, writer, flush_interval_s)
        return cls(aggregator, flusher, audit)
