"""The simulation's seed that found an emptied copy counted toward a restored voting set.

``all`` 222767 (session 36): p2 moved from n1 to n4 (n1 left the voters at 7.7 s and deleted
its copy on its tombstone), n4 led epoch 59 and acknowledged LSN 32 with n3. etcd was wiped,
then restored from a backup of t=0.4 whose record named n2, n1 and n3. n1 read that record
before anyone had raised the incarnation and made a new, empty copy; when the manager
designated again (n3 cut off, n4 cut from etcd), n1's empty copy and n2's made a fresh
majority of the restored set, and n2 led without LSN 32 (``leader-completeness``). A node
now creates a replica it does not hold only on a record designated in the current
incarnation, and never while etcd may have gone back in time unsettled
(``node/reconcile.py``; the pure rule is in tests/cluster/test_reconcile.py).
"""

from __future__ import annotations

import pytest

from .ablations import take_out
from .simulation import config_for, run_seed

SEED = 222767


def test_a_copy_deleted_by_a_move_is_not_made_again_on_the_restored_record() -> None:
    result = run_seed(config_for(SEED, "all"))
    assert result.ok, result.report()


def test_without_the_gate_the_seed_loses_acknowledged_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replicas created on any record that names the node: n2 leads without LSN 32, so the
    test above would catch the gate going away."""
    take_out(["creation-gate"], monkeypatch.setattr)
    result = run_seed(config_for(SEED, "all"))
    assert not result.ok
    assert "leader-completeness" in result.summary()
