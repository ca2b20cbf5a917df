"""The simulation's seed that found a tombstone's LSN bound skipped on a restarted node.

``all`` 291729 (session 37; it also fails on session 36's tree): etcd was restored from a
backup of 0.5 s at 21.0 s, and the manager, planning on the restored leader position of
that time, tombstoned n2's copy of p2 with a bound of LSN 1. n2 refused it (its copy held
LSN 153). n2 was then restarted; its new process found the copy on disk, not read yet, and
a bound it could not check counted as met: it deleted a copy holding acknowledged entries
(``replica-set-overlap``). A bound is now met only by a replica whose last LSN was read
(``node/reconcile.py``); the pure rule is in tests/cluster/test_reconcile.py.

On production's ``Node`` (issue 49) the seed no longer reaches the race with the fix taken
out either; the fix is shown to matter by the deterministic tests test_fixes_pinned.py
runs without it (docs/testing.md, "Fixes pinned by deterministic tests").
"""

from __future__ import annotations

from .simulation import config_for, run_seed

SEED = 291729


def test_a_restarted_node_keeps_a_copy_until_it_has_read_its_last_lsn() -> None:
    result = run_seed(config_for(SEED, "all"))
    assert result.ok, result.report()
