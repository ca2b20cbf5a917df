"""The simulation's seeds that found a copy made again after a move counted as a voter.

``all`` 234061 (session 36; 222767 and 240328 fail the same way): a drain moved p4's replica
from n3 to another node, and n3 deleted its copy on the move's tombstone at 5.3 s; n4 and n1
acknowledged LSN 22; etcd was restored at 15.9 s from a backup that named n3 again, and n3
made a new, empty copy. With the copies holding LSN 22 down or cut off, that copy and n2's
made a majority of the restored set, and n2 led from LSN 21 at 19.1 s
(``leader-completeness``). The node now keeps the move's receipt on its disk and publishes
the new copy as ``remade``; the promotion counts it for nothing (``node/receipts.py``,
``manager/election.py``; real processes in tests/cluster/test_etcd_loss.py).

Not counting it alone left partitions unserved for good (``all`` 230870, session 36's tried
gate): the restored set named one live copy, the copy made again and a node gone for good.
Then a majority of the newest receipt's set heard (the set that replaced the copy, whose
members keep what it acknowledged, served or as strays) lets the best copy anywhere lead.

That set may have moved on (``all`` 320038, session 38): p2 moved from n2 to n3, then from
n3 to n5, and n1 died for good; etcd, wiped, was restored from a backup naming n4, n1, n2.
n2's receipt named n4, n1, n3, of which only n4 held a copy: unserved for good. n3 publishes
its own, newer receipt (n4, n1, n5), and the promotion follows it: n4 and n5 are a majority.

Or a member of it moved its copy away too (``all`` 324971, session 38): n1, gone for good,
n2 made again, n4 moved its copy of p1 away at LSN 2 after the restore, n3 holds LSN 2. n4
held nothing past its receipt's LSN when it deleted, so n3 holds what it acknowledged: n3
and n4 account for a majority of n2's receipt's set (``election.accounted_for``).

On production's ``Node`` (issue 49) these seeds no longer reach the race with the fix taken
out either; the fix is shown to matter by the deterministic tests test_fixes_pinned.py
runs without it (docs/testing.md, "Fixes pinned by deterministic tests").
"""

from __future__ import annotations

import pytest

from .simulation import config_for, run_seed

LOST = 234061
FOUND = [LOST, 240328]
UNSERVED = 230870
MOVED_ON = 320038
MOVED_AWAY = 324971


@pytest.mark.parametrize("seed", FOUND)
def test_a_copy_made_again_after_a_move_does_not_make_a_majority(seed: int) -> None:
    result = run_seed(config_for(seed, "all"))
    assert result.ok, result.report()


def test_the_receipts_set_serves_a_restored_set_with_one_copy_left() -> None:
    result = run_seed(config_for(UNSERVED, "all"))
    assert result.ok, result.report()


def test_a_receipts_set_that_moved_on_is_followed_to_the_newer_receipt() -> None:
    result = run_seed(config_for(MOVED_ON, "all"))
    assert result.ok, result.report()


def test_a_member_that_moved_its_copy_away_is_accounted_for_by_its_receipt() -> None:
    result = run_seed(config_for(MOVED_AWAY, "all"))
    assert result.ok, result.report()
