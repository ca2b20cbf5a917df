"""The simulation's seed that found a node leading on a designation the manager had replaced.

``all`` 100074 (session 34's first sweep): n3 led partition 1, was cut from etcd at 6.3 s and
deposed (the manager promoted n2, which then acknowledged LSNs 65-91 with n1). n3 came back
while etcd was down; when etcd returned, every lease had expired, n2's leader key with them.
n3 opened a new session at once, but its map watch re-opens on its own timer
(``_PrefixFollower``), so its map still named it leader: it claimed the free key and led
epoch 81 from LSN 64, without entries a majority had acknowledged (``leader-completeness``).
A node now claims a leader key only in the same etcd transaction that finds the partition
record it read still there (``Coordinator.campaign``'s ``designation``; the real-etcd side
is ``tests/cluster/test_coordinator.py``).

Later fixes moved 100074's trajectory so that it no longer reaches the race without the
compare; session 35 re-found the class with the compare disabled, on its final tree
(``all`` 100164, 100277 and 100371 lose acknowledged entries without it, and hold with it).

On production's ``Node`` (issue 49) the seed no longer reaches the race with the fix taken
out either; the fix is shown to matter by the deterministic tests test_fixes_pinned.py
runs without it (docs/testing.md, "Fixes pinned by deterministic tests").
"""

from __future__ import annotations

import pytest

from .simulation import config_for, run_seed

FOUND = [100074, 100522, 100164, 100277, 100371]


@pytest.mark.parametrize("seed", FOUND)
def test_a_node_behind_the_map_does_not_lead_on_its_old_designation(seed: int) -> None:
    result = run_seed(config_for(seed, "all"))
    assert result.ok, result.report()
