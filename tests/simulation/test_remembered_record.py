"""The simulation's seed that found an unreadable record nobody could rebuild any more.

``all`` 245739 (session 36): p2's record was corrupted at 15.1 s and etcd backed up with it
at 16.1 s; the manager that led then was killed before it rebuilt it; etcd was wiped at
20.2 s and restored from that backup at 24.0 s. Meanwhile every node had restarted or
reloaded its map after the wipe, so none held the record it had served on, and no live
manager had ever read it: the partition was unserved for good (``available-after-heal``).
Nodes now keep the record each replica was served on in ``DATA/records/<id>`` and publish
it for an unreadable record they never read (``node/remembered_records.py``).

The seed no longer fails with the fix taken out (the ablation ``remembered-records``): the
manager's repair of a record garbled during its own commit (``all`` 303592, later the same
session) moved its trajectory, and no other seed of the sweeps shows the class (one in
about 24,000 found it). What fails without the fix is the real-process test,
tests/cluster/test_never_delete.py::test_a_record_every_node_restarted_since_..., which
restarts every follower after the corruption.
"""

from __future__ import annotations

from .simulation import config_for, run_seed

SEED = 245739


def test_a_record_kept_on_the_nodes_disks_is_rebuilt_after_they_restarted() -> None:
    result = run_seed(config_for(SEED, "all"))
    assert result.ok, result.report()
