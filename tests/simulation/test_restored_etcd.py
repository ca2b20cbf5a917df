"""The simulation's seeds that found a restored etcd mishandled by the managers: they hold.

The first two were found by session 31's sweeps and failed the same way on that session's
first commit; the last two by its last sweep, and they failed on 91f0224 too.

- ``etcd`` 6980: etcd is restored three times and partition 3's record is corrupted between
  the second backup and the third restore. The second restore held no map at all, so the
  managers' views emptied; the third brought back the corrupted record, which every manager
  then took for one it "never read", so none wrote it again, every node kept p3 as a stray,
  and a FIFO group took no send after healing (``available-after-heal``). A manager now
  repairs such a record from the last one it read, whenever that was
  (``manager/manager.py``: ``_ever_read``).
- ``etcd`` 6242: etcd comes back empty, then is restored from an early backup. The manager's
  partitions watch showed the restored map while its queues watch still showed the empty
  etcd, and it planned on that picture: every partition's queue "deleted", so it deleted the
  partition and tombstoned its replicas, and n3 deleted a replica holding acknowledged
  entries (``replica-set-overlap``). A manager now deletes a partition only once etcd, read
  directly, says its queue is gone (``manager/manager.py``: ``_deletions_confirmed``).
- ``etcd`` 7539 and 7014: etcd comes back empty and m1 leads the empty etcd, claiming the
  manager key at revision 3; then etcd is restored from a backup in which m2 held that key,
  also claimed at revision 3. m1's fenced commit compared the epoch (the revision) alone, so
  it held; and m1's queues watch showed the restored queue while its partitions watch still
  showed the empty etcd, so it placed a second partition for q0's index 0. Nodes served the
  new, empty partition; the old one, holding the queue's messages, stayed a stray, and a FIFO
  group took no send after healing. Two defences now, each enough for both seeds: a fence
  names its holder as well as its epoch (``coordination/coordinator.py``: ``fenced_commit``),
  and a manager places a partition only once etcd, read directly, holds none for its slot
  (``manager/manager.py``: ``_creations_confirmed``).
- ``etcd`` 100 (found once the model re-opened each prefix's watch on its own timer, as
  ``_PrefixFollower`` does, session 33): etcd is restored, a node raises the incarnation to
  2 and takes the raised record from its own read, and etcd is restored again from the same
  backup 5 ms later, before the node's watch has seen the raise. The restored record equals
  the one the watch last yielded, so it was never yielded again, and every node kept
  incarnation 2 while etcd held 0: each designated leader held off as "designated before etcd
  went back in time", and a partition took no send after healing. A node's cluster record is
  now the one its watch holds, and only that (``node/node_identity.py``), and a watch compares
  a fresh read with the state its consumer holds (``Coordinator.watch_prefix``'s ``held``).
- ``restore`` 60781 (session 33): etcd restored while n3 was frozen; the node records came
  back with the snapshot, showing their positions of that time, and the manager designated
  n3 on its restored position, 3 entries behind what n1 had acknowledged since. After a
  restore a promotion now counts only positions published since the incarnation was raised
  (``manager/plan.py``; ``tests/cluster/test_manager_plan.py`` pins the rule).
- ``restore`` 90601 (session 34, the first sweep after that rule): etcd restored twice, the
  second time from a backup taken after the first raise, which changed no leader key. n1 and
  n2, the voters ahead, saw nothing that made them write their records again, so the records
  etcd held were the backup's, older than the second raise, and the manager waited for their
  fresh positions for good: q0's index 1 took no send after healing. A node now writes its
  record again whenever the incarnation moved since its last write (``node/publication.py``,
  pinned by ``tests/cluster/test_publication.py``).
- ``all`` 100400 (session 34): etcd restored twice to a backup from before p2 moved from n1
  to n2. n4, ahead, was designated again in the new incarnation and froze before it led; n5
  was then promoted on the restored set's majority (n5 and n1, whose copy was deleted by the
  move) without three acknowledged entries that n4 and n2's stray held. Every copy now counts
  until a term of the new incarnation has written an entry, designated again or not
  (``manager/election.py``, ``unsettled``; ``tests/cluster/test_manager_plan.py``).
- ``all`` 100851 (session 34): after a restore n2 (its copy emptied) and another voter had
  published since the raise, a majority; the node holding LSNs 1-3 had not, and n2 was
  designated. While every copy counts, every live node must now have published since the
  raise (a dead one's restored record expires): ``manager/election.py``, ``unheard``.
- ``all`` 130314 (session 34): etcd came back empty, a new node made a new cluster id in it,
  and a manager restarted then trusted that id first; once the real etcd was restored it
  refused it for good (session 33's rule for ``all`` 51983) and a partition took no send
  after healing. A manager plans for any readable cluster id again; deletions are guarded
  on the node (``test_wiped_etcd.py``).
- ``all`` 150423 (session 34's last sweep): after a restore n4 raised the incarnation and read
  its raise back with ``WatchedPrefix.refresh``; the read was older than the record held from
  before the restore, so it was left to a confirming read, and n4 decided on incarnation 0
  meanwhile: designated by the restored map, it found its own restored leader key and led at
  that key's old epoch from an emptied copy, writing an LSN 1 unlike the others'
  (``log-matching``). A read of our own that comes back older is now taken at once
  (``coordination/watched_prefix.py``; ``tests/cluster/test_coordinator.py``).
"""

from __future__ import annotations

import pytest

from .ablations import take_out
from .simulation import config_for, run_seed

FOUND = [
    ("etcd", 6980),
    ("etcd", 6242),
    ("etcd", 7539),
    ("etcd", 7014),
    ("etcd", 100),
    ("restore", 60781),
    ("restore", 90601),
    ("all", 100400),
    ("all", 100851),
    ("all", 130314),
    ("all", 150423),
]


@pytest.mark.parametrize(("mix", "seed"), FOUND, ids=[f"{m}-{s}" for m, s in FOUND])
def test_a_restored_etcd_loses_nothing_and_leaves_nothing_unserved(mix: str, seed: int) -> None:
    result = run_seed(config_for(seed, mix))
    assert result.ok, result.report()
    assert result.acked > 0


@pytest.mark.parametrize("seed", [7539, 7014])
def test_a_manager_whose_fence_holds_by_accident_still_places_no_partition_twice(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The direct read alone holds both seeds: the fence weakened to the epoch it compared
    before, the wrong manager's plan gets through it and is stopped by the read."""
    take_out(["fence-holder"], monkeypatch.setattr)
    result = run_seed(config_for(seed, "etcd"))
    assert result.ok, f"{result.summary()}\n{result.trace_text(40)}"
