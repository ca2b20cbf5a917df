"""The simulation's seeds that found a corrupted partition record left unserved for good.

``all`` 130473 (session 35): etcd's record of p2 was corrupted while n4 led it on replicas
n4, n5, n1; m1 was killed before and came back never having read it, so it was unknown to the
manager that led from then on (neither absent nor known: nothing is planned on it). n4 lost
its etcd session and gave its key up, nobody was designated again, and p2 took no send for
the rest of the run (``available-after-heal``). 131005 and 203853 fail the same way. The
nodes that read the record kept serving on it; they now publish it (``NodeRecord.kept``) and
the manager writes it back (manager/recovery.py): in all three, the leader's own kept record,
while it still held the key (the rebuild without a leader is covered by the pure rules and
the real processes). The pure rules
are in tests/cluster/test_unreadable_records.py, the real processes in
tests/cluster/test_never_delete.py.

On production's ``Node`` (issue 49) these seeds no longer reach the race with the fix taken
out either; the fix is shown to matter by the deterministic tests test_fixes_pinned.py
runs without it (docs/testing.md, "Fixes pinned by deterministic tests").
"""

from __future__ import annotations

import pytest

from .simulation import config_for, run_seed

SEEDS = (130473, 131005, 203853)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_record_the_manager_never_read_is_rebuilt_from_what_the_nodes_kept(seed: int) -> None:
    result = run_seed(config_for(seed, "all"))
    assert result.ok, result.report()


def test_a_copy_deleted_on_its_tombstone_is_judged_against_the_set_its_garbled_record_held() -> None:
    """``all`` 275876 (session 37): a move's tombstone let n4 delete its copy of p2, and the
    record was garbled 53 ms before n4 did (its tombstone and cluster reads came first). The
    new set held everything, so nothing was unsafe, but the oracle judged the deletion
    against the garbled record, no set at all: it now judges against the set the record held
    before it was garbled (``Oracle.corrupted``)."""
    result = run_seed(config_for(275876, "all"))
    assert result.ok, result.report()


def test_a_record_garbled_while_the_managers_commit_was_in_flight_is_repaired() -> None:
    """``all`` 303592 (session 37; it also fails on session 36's tree): m2 promoted n1, and
    p1's record was garbled just after that commit. m2's watch showed the garbled record
    before the commit returned, and m2 then cleared the mark on its own write. It never
    wrote the record again, and p1 was unserved for good (``available-after-heal``). A
    commit now clears no mark if the watch spoke while it was under way
    (``manager.cleared_marks``)."""
    result = run_seed(config_for(303592, "all"))
    assert result.ok, result.report()


def test_a_record_garbled_again_while_the_commit_that_repaired_it_was_in_flight_is_repaired() -> None:
    """``all`` 421472 (session 40; it holds on session 38's code, and fails since session
    39's first fix moved its trajectory): p1's record was garbled; m2's promotion of n3
    wrote it again, and it was garbled again 1 ms later. The watch showed that before the
    commit returned, with the mark the plan had seen, and the commit cleared it as its own
    repair: no manager wrote p1 again, the nodes held the restored record whose designation
    was stale, and p1 took no send after healing (``available-after-heal``)."""
    result = run_seed(config_for(421472, "all"))
    assert result.ok, result.report()
