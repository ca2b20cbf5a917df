"""The simulation's seed that found a node replaced after it died, back after a restore.

``returns`` 255 (session 38): n3 died for good at 2.8 s and was drained; p1 moved its replica
to n4, and n4, leading at epoch 67, acknowledged LSN 22 with n2. etcd was restored at 10.4 s
from the backup of t=0.5, whose set for p1 was n1, n2, n3. n4 and n2 were then killed, n3's
host came back with its old copy, and n1 (LSN 19) and n3 made a majority of the restored set:
n1 led without LSN 22 (``leader-completeness``). The dead n3 deleted nothing, so no receipt
told of the move. n1's copy had been served on n1, n2, n4 and keeps that set on its disk
(``node/served_sets.py``); after a restore the promotion waits until a majority of every such
set is heard (``manager/election.py``). The mix ``returns`` exists for this: ``all`` never
brings a replaced node back.

That gate alone left partitions unserved for good (``returns`` 1071 and 1333, the first
sweep of the mix): a member of an earlier set that moved its copy away after the restore
could never be heard. It counts when the best live copy reaches its receipt's bound. And a
stray counts by its rank even when its node's record predates the last leader key seen
(``returns`` 2144 and 3853: a stray takes no entries, so that record still says what it
holds; it was left unheard for good).

On production's ``Node`` (issue 49) the seed no longer reaches the race with the fix taken
out either; the fix is shown to matter by the deterministic tests test_fixes_pinned.py
runs without it (docs/testing.md, "Fixes pinned by deterministic tests").
"""

from __future__ import annotations

import pytest

from .simulation import config_for, run_seed

FOUND = 255
UNSERVED = [1071, 1333, 2144, 3853]


def test_a_node_back_after_its_replacement_does_not_make_a_majority_with_an_old_copy() -> None:
    result = run_seed(config_for(FOUND, "returns"))
    assert result.ok, result.report()


@pytest.mark.parametrize("seed", UNSERVED)
def test_an_earlier_sets_members_are_heard_by_receipt_or_stray_rank(seed: int) -> None:
    result = run_seed(config_for(seed, "returns"))
    assert result.ok, result.report()
