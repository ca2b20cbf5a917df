"""The simulation's seed that found a node leading on a designation from before a restore.

``all`` 50473 (session 35): n4 led p2 and was cut off from everything at 2.7 s; m2 promoted
n2, which acknowledged LSNs 12-14. etcd was then restored from a backup of t=0.5, whose map
designated n4 again; n1 found etcd gone back and raised the cluster's incarnation, so the
restored designation was stale (the manager waits for every copy before designating anew).
n4, healed after another outage, re-read the map (the restored record, naming it) before
its cluster watch showed the raise: judged by incarnation 0, the designation looked
current, the record was still in etcd, and n4 claimed the free key and led from LSN 11
(``leader-completeness``). A node's claim now also compares the cluster record it judged
the designation by (``Coordinator.campaign``'s ``unchanged``; the real-etcd side is
``tests/cluster/test_coordinator.py``).

On production's ``Node`` (issue 49) the seed no longer reaches the race with the fix taken
out either; the fix is shown to matter by the deterministic tests test_fixes_pinned.py
runs without it (docs/testing.md, "Fixes pinned by deterministic tests").
"""

from __future__ import annotations

from .simulation import config_for, run_seed

SEED = 50473


def test_a_node_behind_the_incarnation_does_not_lead_on_a_restored_designation() -> None:
    result = run_seed(config_for(SEED, "all"))
    assert result.ok, result.report()
