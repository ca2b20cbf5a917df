"""The simulation's seeds that found a restored etcd mishandled by the managers: they hold.

Both found by session 31's sweeps; both failed the same way on the session's first commit.

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
"""

from __future__ import annotations

import pytest

from .simulation import config_for, run_seed

FOUND = [("etcd", 6980), ("etcd", 6242)]


@pytest.mark.parametrize(("mix", "seed"), FOUND, ids=[f"{m}-{s}" for m, s in FOUND])
def test_a_restored_etcd_loses_nothing_and_leaves_nothing_unserved(mix: str, seed: int) -> None:
    result = run_seed(config_for(seed, mix))
    assert result.ok, (
        f"{result.summary()}\nreplay: scripts/simulate --seed {seed} --faults {mix}\n{result.trace_text(40)}"
    )
    assert result.acked > 0
