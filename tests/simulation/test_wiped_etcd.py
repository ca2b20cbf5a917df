"""The simulation's seeds that replay the deletion a CI run found after an etcd wipe: they hold.

Session 32's CI run: after etcd came back empty, a manager whose queues watch already showed
the emptied etcd, while its cluster watch still showed the cluster record, planned on that
picture: every partition's queue "deleted", so it deleted the partition and tombstoned its
replicas, and a node deleted a replica holding acknowledged entries on that tombstone. The
fix (a direct read of the cluster record before any plan that deletes or tombstones,
``manager/manager.py``: ``_cluster_confirmed``) came first; the simulation could not replay
it, because its model of etcd's client read every prefix again at once when a connection
came back. Since session 33 each prefix's watch re-opens on its own timer, up to 0.5 s apart,
as ``etcd_coordinator._PrefixFollower`` does, and ``etcd`` seeds 1, 28 and 121 replay the
deletion without the manager's direct read (13 of seeds 0-199 did, before the model's node
read the record directly too, as production's does; now each read alone holds seed 1).
Seed 5 is here since session 59, as the ablation below uses it.

``all`` 51983 (session 33's last sweep): etcd wiped twice; after the second wipe a node new
to the cluster (it keeps no cluster id) found etcd empty and made a new cluster in it, as a
first node does. The managers judged etcd by whether it held *a* cluster id, not the one
they had trusted, so m2 planned on the new etcd, deleted the old cluster's partitions and
tombstoned their replicas, and n2 deleted a replica holding acknowledged entries. Session 33
made a manager refuse a cluster id other than the one it trusted first; session 34 found
that a manager started while the foreign id was there then planned nothing for good once
the real etcd was restored (``all`` 130314, 130698, 131073, 131174), and found why a
replica was deleted: the tombstones the manager wrote into the foreign etcd were still the
node's watch's when the real etcd came back, and the cluster record, read directly, was
the node's own again. A node now reads each tombstone directly too before deleting
(``node/etcd_records.py``, ``tombstone_stands``), and a manager plans for any readable
cluster id again.
"""

from __future__ import annotations

import pytest

from .ablations import BACK_ON_THE_RACE, take_out
from .simulation import config_for, run_seed

FOUND = [1, 5, 28, 121]


@pytest.mark.parametrize("seed", FOUND)
def test_a_wiped_etcd_deletes_nothing(seed: int) -> None:
    result = run_seed(config_for(seed, "etcd"))
    assert result.ok, result.report()


def test_without_the_direct_reads_the_seed_finds_the_deletion(monkeypatch: pytest.MonkeyPatch) -> None:
    """The manager and the nodes trusting their watches' picture again (each read alone
    holds the seeds, and since session 35 so does the manager's fresh read when it wins):
    seeds 1 and 5 delete a replica holding acknowledged entries (any one is enough), so
    the test above would catch the direct reads going away. They were 1, 3 and 6 until
    session 57's change to the gateway's calls moved those off the race, then 37 and 39
    until session 59's nodes stopped reconciling every replica on each change to
    ``queues/`` (of ``etcd`` 0-59, 1, 5, 10, 38 and 49 reach it; 1 and 5 hold with the
    reads). Since session 63 a manager's commit also expects the partition records its plan
    was made on, which the wiped etcd does not hold: that defence alone holds them too, and
    is taken out as well."""
    take_out([*BACK_ON_THE_RACE, "direct-reads", "fresh-read", "record-expectations"], monkeypatch.setattr)
    summaries = [run_seed(config_for(seed, "etcd")).summary() for seed in (1, 5)]
    assert any("deleted its replica" in summary for summary in summaries), summaries


def test_the_managers_record_expectations_alone_hold_the_wiped_etcd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Session 63's defence (a CI run: a plan on a partition the restored etcd no longer
    held): the manager's commit expects the partition records its plan was made on. With the
    direct reads and the fresh read out, as above, seed 1 holds by it alone: the wiped etcd
    holds none of the records the deletion was planned on, so the commit changes nothing."""
    take_out([*BACK_ON_THE_RACE, "direct-reads", "fresh-read"], monkeypatch.setattr)
    result = run_seed(config_for(1, "etcd"))
    assert result.ok, result.report()


def test_a_node_deletes_only_on_a_tombstone_etcd_holds_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """``all`` 51983 holds. Two defences hold such seeds now, each alone: the node's direct
    read of each tombstone, and ``WatchedPrefix.refresh`` taking a read that shows etcd went
    back (session 34, seed ``all`` 150423). Session 34 showed it on 51983 itself: with the
    node trusting its tombstones' watch as well, the tombstones a manager wrote into the
    foreign cluster's etcd were still the watch's when the real etcd was restored, the
    cluster record read directly was the node's own, and a replica holding acknowledged
    entries was deleted. Later changes moved 51983 off that race; ``all`` 51696 holds with
    the refresh as it was (the tombstone read alone). With both taken out, 51696 used to
    fail, but its deletion was of a copy whose record had been garbled just before, which
    the oracle judged against no replica set at all; judged against the set the record held
    (session 37, ``Oracle.corrupted``), that deletion was safe, and no seed of ``all``
    50000-52999 or ``etcd`` 0-1999 shows the race with both taken out. The direct read is
    tested on a real etcd in tests/cluster/test_tombstone_read.py."""
    result = run_seed(config_for(51983, "all"))
    assert result.ok, result.report()
    take_out([*BACK_ON_THE_RACE, "refresh-back-in-time"], monkeypatch.setattr)
    guarded = run_seed(config_for(51696, "all"))
    assert guarded.ok, guarded.summary()
