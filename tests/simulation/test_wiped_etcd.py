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
deletion without the direct read (13 of seeds 0-199 do).
"""

from __future__ import annotations

import pytest

from backend_store.cluster.manager.manager import Manager

from .simulation import config_for, run_seed

FOUND = [1, 28, 121]


@pytest.mark.parametrize("seed", FOUND)
def test_a_wiped_etcd_deletes_nothing(seed: int) -> None:
    result = run_seed(config_for(seed, "etcd"))
    assert result.ok, (
        f"{result.summary()}\nreplay: scripts/simulate --seed {seed} --faults etcd\n{result.trace_text(40)}"
    )


def test_without_the_direct_read_the_seed_finds_the_deletion(monkeypatch: pytest.MonkeyPatch) -> None:
    """The manager trusting its watches' picture again: seed 1 deletes a replica holding
    acknowledged entries, so the test above would catch the direct read going away."""

    async def trusting(self: Manager) -> bool:
        return True

    monkeypatch.setattr(Manager, "_cluster_confirmed", trusting)
    result = run_seed(config_for(1, "etcd"))
    assert not result.ok
    assert "deleted its replica" in result.summary()
