"""The simulation's seed that found a deposed leader's write logged in the next term.

``all`` 231542 (session 36): n1 led p1 at epoch ...832 on a slow disk and resigned for lack
of a quorum; n2 led ...842 from LSN 57 and wrote LSN 58. Its first shipment made n1 drop its
tail after LSN 57, raising n1's fence to ...842; a send n1 had taken as leader was still
queued in its store's writer, and the writer logged it as the next entry with the fence as
its epoch: LSN 58, epoch ...842, with other contents than n2's (``log-matching``: log
matching takes the two for the same entry). A store now logs its own writes only in the
term it started last (``replication_log.py``, ``NotLeading``; on real LMDB stores in
tests/cluster/test_one_entry_per_lsn_and_epoch.py).

On production's ``Node`` (issue 49) the seed no longer reaches the race with the fix taken
out either; the fix is shown to matter by the deterministic tests test_fixes_pinned.py
runs without it (docs/testing.md, "Fixes pinned by deterministic tests").
"""

from __future__ import annotations

from .simulation import config_for, run_seed

SEED = 231542


def test_a_deposed_leaders_queued_write_is_not_logged_in_the_next_term() -> None:
    result = run_seed(config_for(SEED, "all"))
    assert result.ok, result.report()
