"""The simulation's seed that found a promotion on a position published before the last term.

``all`` 130837 (session 34): n1 followed n3's term of p1 and acknowledged LSNs 24-26 with it,
but its node loop was held in another partition's first commit (it had just been designated
for p4, whose followers it could not reach), so its record still showed the position it
published before n3 led: LSN 23, no leader key seen. When n3's key vanished, that record and
n2's (back from a restart at LSN 23) made a majority of "fresh" positions, and n2 led without
LSNs 24-26 (``leader-completeness``). A position now counts only if its record was written
after the partition's key was last seen (``ClusterView.leader_seen``, ``election.promote``'s
``outdated``; the rule alone is pinned in ``tests/cluster/test_manager_plan.py``).

Session 35's manager changes moved 130837 off the race; without the sightings, ``all``
130684 (one of 130000-131999) loses acknowledged entries on its final tree, and holds with
them. The sightings also hold the other class the forgetful manager shows there, a
promotion that waits for good (``available-after-heal``), but 130473 and 131005 fail that
way with them too (a corrupted partition record, docs/testing.md), so they pin nothing.

On production's ``Node`` (issue 49) the seed no longer reaches the race with the fix taken
out either; the fix is shown to matter by the deterministic tests test_fixes_pinned.py
runs without it (docs/testing.md, "Fixes pinned by deterministic tests").
"""

from __future__ import annotations

import pytest

from .simulation import config_for, run_seed

FOUND = [130837, 130684]


@pytest.mark.parametrize("seed", FOUND)
def test_a_position_from_before_the_last_term_is_not_fresh(seed: int) -> None:
    result = run_seed(config_for(seed, "all"))
    assert result.ok, result.report()
