"""The simulation's seed that found a node leading on its own leader key from a restored etcd.

``all`` 203747 (session 35): n1 led p1 at epoch 10 and was cut off from its peers; n3 led
epoch 37 and then lost its quorum too, and m1 named n1 again. etcd was then restored from a
backup of t=0.5, which held n1's epoch-10 leader key under n1's lease (still alive: leases
survive a restore). n1 campaigned on the record that named it before the restore; the
record's compare failed, but ``campaign`` reported the key under n1's own lease as won
before it looked at the compares, and n1 led epoch 10 again and acknowledged LSN 28 while
epoch 37 existed (``leader-completeness``). A key of one's own lease found while a compared
record changed is now refused and deleted (``Coordinator.campaign``; the real-etcd side is
``tests/cluster/test_coordinator.py``).

On production's ``Node`` (issue 49) the seed no longer reaches the race with the fix taken
out either; the fix is shown to matter by the deterministic tests test_fixes_pinned.py
runs without it (docs/testing.md, "Fixes pinned by deterministic tests").
"""

from __future__ import annotations

from .simulation import config_for, run_seed

SEED = 203747


def test_a_node_does_not_lead_on_its_restored_key_once_its_record_changed() -> None:
    result = run_seed(config_for(SEED, "all"))
    assert result.ok, result.report()
