"""The simulation's seed that found a watch blind to a key restored at a reused revision.

``restore`` 1740213 (session 74, ``available-after-heal``): etcd was restored twice; the
second restore (to a backup of t=7.9, taken before the first restore renumbered the
revisions) brought back n3's leader key of p1 and n2's of p2, under leases both nodes still
kept alive, at the mod revisions the keys n2 and n4 had won since. The watches compared
states by mod revision alone, so no node's listener heard of the restored keys: n2 and n4
kept deleting keys etcd did not hold (rule 10 of leadership.py), n3 and n2 never learned they
held keys they did not serve, and the manager waited for them to serve; q0 took no send for
the rest of the run. States are now compared entry by entry (``changed_keys``, as
``changed_in_pages`` already did; tests/cluster/test_watched_prefix_restore.py).
"""

from __future__ import annotations

from .simulation import config_for, run_seed

SEED = 1740213


def test_a_key_restored_at_a_revision_another_key_had_is_seen_and_the_cluster_serves() -> None:
    result = run_seed(config_for(SEED, "restore"))
    assert result.ok, result.report()
