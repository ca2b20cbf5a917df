"""A queue made after a backup, then etcd restored to that backup: the simulation's ``since`` mix.

Session 62's CI run (``tests/cluster/test_etcd_loss.py``, real processes): after etcd was
restored from a snapshot older than a queue with a partition of its own, a manager planned
on a picture that still held the partition and no longer held the queue, deleted the
partition and tombstoned its copies, and two nodes deleted copies holding acknowledged
messages. Session 63 made a manager's commit expect the partition and queue records its
plan was made on (``Manager._records_expected``); the simulation could not reach that
race, since every non-pool mix made its queues before the first backup. ``since`` (session
64) makes a queue with partitions of its own during the chaos, sends to it, and restores
older backups, half of which lose it: of seeds 0-59, 8 and 21 delete a copy holding
acknowledged entries with both of the manager's defences out (its direct reads before a
deletion, and its record expectations), and hold with either one. Session 86's nodes (a voter
counts towards a campaign once it wrote its record since the campaigner registered) moved
both off the race: of seeds 0-199, 34 and 158 do so, and take their places. 158 holds with
either defence alone; 34 holds with the expectations alone and not with the direct reads
alone.
"""

from __future__ import annotations

import pytest

from .ablations import take_out
from .simulation import config_for, run_seed

LOST_THE_QUEUE = [34, 158]


@pytest.mark.parametrize("seed", LOST_THE_QUEUE)
def test_a_queue_a_restore_lost_keeps_its_copies(seed: int) -> None:
    result = run_seed(config_for(seed, "since"))
    assert result.ok, result.report()
    # What the seed is here for: the late queue was sent to, and a restore lost its records.
    assert "made later; a restore lost late's records" in result.topology, result.summary()


def test_the_record_expectations_alone_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    take_out(["direct-reads"], monkeypatch.setattr)
    for seed in LOST_THE_QUEUE:
        result = run_seed(config_for(seed, "since"))
        assert result.ok, result.report()


def test_the_direct_reads_alone_hold_158_and_not_34(monkeypatch: pytest.MonkeyPatch) -> None:
    """In 34 a deletion the manager confirmed by reading etcd directly still straddled the
    restore: only the expectations, part of the commit itself, catch that."""
    take_out(["record-expectations"], monkeypatch.setattr)
    held = run_seed(config_for(158, "since"))
    assert held.ok, held.report()
    lost = run_seed(config_for(34, "since"))
    assert lost.violation is not None and lost.violation.invariant == "replica-set-overlap", lost.summary()


def test_without_both_a_copy_holding_acknowledged_entries_is_deleted(monkeypatch: pytest.MonkeyPatch) -> None:
    """So the tests above would catch both defences going away."""
    take_out(["direct-reads", "record-expectations"], monkeypatch.setattr)
    results = [run_seed(config_for(seed, "since")) for seed in LOST_THE_QUEUE]
    assert all(r.violation is not None and r.violation.invariant == "replica-set-overlap" for r in results), [
        r.summary() for r in results
    ]
