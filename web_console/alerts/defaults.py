"""The rules a fresh store starts with, so an operator never starts from an empty table.

On its first sample a gateway gives the operator tenant these rules once per store: when
the store has no record that it did (``alerts-defaults/<tenant>`` in the store's metadata)
and the tenant has no rules of its own. A store whose operator already set rules keeps
exactly those (only the record is written), and rules the operator deleted or changed are
never put back: the record stays. The rules are ordinary rules, listed, edited and deleted
as any other.

Why fixed ids (``default-...``): several gateways starting together on one store may each
install them; the same id written twice is one rule, not two. A gateway that stops between
the rules and the record finds its own rules at the next start and only writes the record.
"""

from __future__ import annotations

import logging
import time

from .rules import AlertRule
from .store import RuleStore

log = logging.getLogger("pushgate.alerts")


def default_rules(tenant: str, now: float = 0.0) -> list[AlertRule]:
    """Thresholds an operator can live with before tuning them (docs/console.md)."""

    def rule(
        suffix: str,
        kind: str,
        threshold: float,
        description: str,
        for_s: float = 0.0,
        window_s: float = 300.0,
    ) -> AlertRule:
        return AlertRule(
            id=f"default-{suffix}",
            tenant=tenant,
            kind=kind,
            threshold=threshold,
            for_s=for_s,
            window_s=window_s,
            description=description,
            created_at=now,
        )

    return [
        rule(
            "dead-letters",
            "dead_lettered",
            0,
            "messages of a queue moved to its dead-letter queue in the last 5 minutes",
            window_s=300,
        ),
        rule("oldest-age", "oldest_age", 3600, "a queue's oldest message is over an hour old", for_s=60),
        rule(
            "node-down", "node_down", 0, "a cluster node is down or refuses the cluster etcd holds", for_s=30
        ),
        rule(
            "replication-lag",
            "replication_lag",
            10_000,
            "a node's replicas are over 10,000 log entries behind their leaders",
            for_s=60,
        ),
        rule("map-use", "map_use", 85, "a store environment is 85% of its maximum map size"),
        rule("disk-use", "disk_use", 90, "a node's file system is 90% full"),
    ]


async def install_defaults(store: RuleStore, tenant: str) -> bool:
    """Give ``tenant`` the default rules if this store never did; True if they were added."""
    if await store.defaults_given(tenant):
        return False
    if await store.list(tenant):
        await store.mark_defaults_given(tenant, "kept the rules the tenant had")
        return False
    now = time.time()
    for rule in default_rules(tenant, now):
        await store.put(rule)
    await store.mark_defaults_given(tenant, "installed")
    log.info("gave tenant %s the default alert rules (docs/console.md)", tenant)
    return True
