"""The simulation's seeds that found a hand-over to a node cut off a moment before.

``minority`` 400568 and 400730 (found by session 38's sweep; they fail on session 37's code
too): a node was cut from its peers, and 0.25-0.31 s later the rebalancer moved a
partition's leadership to it. The leader had heard from it within a heartbeat, so the
hand-over went through at once; the new leader's first entry then waited 5 s for a majority
inside ``lead``, which the node's reconcile tick awaits, so check-quorum could not give the
term up: sends waited 5.2 s against the 3 s bound (``minority-fault-availability``). Two fixes
(``node/term.py``), each of which moves these seeds off the race, so the test that shows they
matter takes out both (each alone in tests/cluster/test_new_term.py, on real components):

- ``handover-answer``: a hand-over begins only once the successor answered after it was asked;
- ``first-entry-task``: the term's first entry and attributes are written in a task.

On production's ``Node`` (issue 49) the seed no longer reaches the race with the fix taken
out either; the fix is shown to matter by the deterministic tests test_fixes_pinned.py
runs without it (docs/testing.md, "Fixes pinned by deterministic tests").
"""

from __future__ import annotations

import pytest

from .simulation import config_for, run_seed

FOUND = (400568, 400730)


@pytest.mark.parametrize("seed", FOUND)
def test_no_term_is_handed_to_a_node_cut_off_a_moment_before(seed: int) -> None:
    result = run_seed(config_for(seed, "minority"))
    assert result.ok, result.report()
