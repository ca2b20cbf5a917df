"""Which of issue 24's defects a violation shows, read from the facts noted before it.

A guess with its reasons, for the report and the ``KNOWN_DEFECT_SEEDS`` table; the violation
itself is the finding. The defects (issue 24, "It does not hold where operators act"):

1. an etcd that comes back empty (or restored, or a record that cannot be read) makes nodes
   delete every replica the map does not name;
2. replica-set changes are a one-step swap: a copy is deleted before its replacement caught up;
3. a designated leader need not be up to date;
4. two different entries with the same (LSN, epoch) after an early ship whose commit failed;
6. a restored etcd's revisions go backwards (epochs come again; the gateway's watches keep
   the newer-looking map) and an empty etcd is trusted;
7. leadership handed to a node that cannot lead.
"""

from __future__ import annotations

from collections.abc import Sequence

from .oracle import Fact, Violation

DEFECTS = {
    1: "an empty or restored etcd (or an unreadable record) makes nodes delete replicas the map does not name",
    2: "a replica-set change is a one-step swap: a copy is deleted before its replacement caught up",
    3: "a designated leader need not be up to date",
    4: "two different entries with the same (LSN, epoch) after an early ship whose commit failed",
    6: "a restored etcd's revisions go backwards and watches ignore it; an empty etcd is trusted",
    7: "leadership is handed to a node that cannot lead",
}


def defect_of(violation: Violation, facts: Sequence[Fact]) -> int | None:
    before = [f for f in facts if f.at <= violation.at]
    kinds = {f.kind for f in before}
    etcd_back = bool(kinds & {"etcd-empty", "etcd-restored"})
    detail = violation.detail
    match violation.invariant:
        case "replica-set-overlap" | "acknowledged-write-lost":
            if "does not name the partition" in detail or "start-up sweep" in detail:
                return 1
            if "truncated" in detail:
                return 3
            return 2
        case "leader-completeness":
            return 6 if etcd_back and "epoch" in detail and _epoch_reused(before) else 3
        case "log-matching":
            if "commit-lost" in kinds:
                return 4
            return 6 if etcd_back else None
        case "one-leader-per-epoch":
            return 6 if etcd_back else None
        case "readable-after-heal" | "available-after-heal":
            if "gateway-map-ahead-of-etcd" in kinds:
                return 6
            if "etcd-empty" in kinds:
                return 1
            return None
        case "minority-fault-availability":
            return 7 if "designated-cannot-lead" in kinds else None
    return None


def _epoch_reused(facts: Sequence[Fact]) -> bool:
    return any(f.kind == "etcd-restored" or f.kind == "etcd-empty" for f in facts)


def diagnose(violation: Violation, facts: Sequence[Fact]) -> str:
    defect = defect_of(violation, facts)
    relevant = [f for f in facts if f.at <= violation.at][-4:]
    reasons = "; ".join(f"t={f.at:.1f} {f.kind}: {f.detail}" for f in relevant)
    if defect is None:
        return f"not one of issue 24's listed defects (facts: {reasons or 'none'})"
    return f"defect {defect} ({DEFECTS[defect]}); facts: {reasons or 'none'}"
