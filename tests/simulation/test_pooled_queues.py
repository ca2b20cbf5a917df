"""Many queues on few partitions in the simulation (issue 49; docs/cluster.md, "Shared
partitions"): 200 queues in one pool of 8 partitions, queues created and deleted during the
faults (``sim_pools.py``), no acknowledged send lost. (Seed 3 did until the heartbeat fix of
issue 48 moved its schedule: session 50; seed 0 until a leader made a new queue on its first
request, which moved its schedule off the restore: session 51, seed 1; seeds 1 and 5 until
session 57's simulated lease rule (in doubt past its deadline until etcd answers, as
production's) moved theirs; seed 16 until session 59's leaders applied a record's change
after a short delay rather than at once, and the simulated gateway asked each new queue's
leaders to make it, as the real one does, and routed its calls to a pool partition bound to
the queue, as the real one does: of ``pools`` 0-39, 0, 1, 3, 5, 11, 14, 15, 16, 20, 22, 23,
24, 25, 26, 30 and 39 reach it; seed 3 until session 61's managers watched queue records only
while leading and read the partition counter once a term: of ``pools`` 0-39, 1, 4, 5, 10, 15,
20, 25, 29, 31-35, 37 and 38 reach it; seeds 1 and 5 until session 73's gateway stopped
asking a new queue's leaders to make it (a create is a record write; each leader's pass
makes its new queues together): of ``pools`` 0-39, 9, 14-16, 18, 19, 21-23, 27, 30, 35 and
37 reach it, and none violates.)

Seeds 4 and 7 of the ``pools`` mix restore etcd to the backup taken before the producers'
queues existed: their records are lost, their messages must not be; healing makes the
queues again, and every acknowledged send is read back from the same partitions. (Seeds 9
and 14 did until session 86's nodes, which count a voter towards a campaign only once it
wrote its record since, moved them off it: of ``pools`` 0-39, 4, 7, 8, 10, 13, 15, 18-20,
24, 27, 28, 30, 32 and 38 reach it.)

Seeds 1732521 and 1732544 held a partition for good after a restore undid a move (session
87): the nodes that had deleted their copies on the move made them again, empty, and session
86's rule 9 counted no such copy towards a campaign, so the node the manager designated on
the move's receipt heard a majority of nobody and held off while the manager designated it
anew, thousands of times. An empty copy now counts where its receipt's set includes the
campaigning node (``leadership.heard_copies``, ablation ``remade-receipt``).

Seeds 1732814 and 1732848 are leaders that resigned for lack of a quorum and held off for
the window after it: the manager designated each anew at every plan meanwhile, each plan
following its own last commit, 31 writes of one partition record within a second
(``record-write-storm``). It now designates a resigned leader anew once per resignation
(``election.designated_since_resigning``, ablation ``designate-once``; session 88)."""

from __future__ import annotations

import pytest

from .ablations import take_out
from .simulation import config_for, run_seed


@pytest.mark.parametrize("seed", [4, 7])
def test_queues_whose_records_a_restore_lost_keep_their_messages(seed: int) -> None:
    result = run_seed(config_for(seed, "pools"))
    assert result.ok, result.report()
    assert "made again after a restore" in result.topology, result.summary()
    assert "churn:" in result.topology and result.acked > 0


def test_every_fault_with_many_queues_on_few_partitions() -> None:
    result = run_seed(config_for(0, "pools-all"))
    assert result.ok, result.report()
    assert result.acked > 0


REMADE = [1732521, 1732544]


@pytest.mark.parametrize("seed", REMADE)
def test_a_restore_that_undid_a_move_leaves_no_partition_waiting(seed: int) -> None:
    result = run_seed(config_for(seed, "pools"))
    assert result.ok, result.report()


def test_without_counting_remade_copies_a_partition_waits_for_good(monkeypatch: pytest.MonkeyPatch) -> None:
    take_out(["remade-receipt"], monkeypatch.setattr)
    result = run_seed(config_for(REMADE[1], "pools"))
    assert result.violation is not None, result.summary()
    assert result.violation.invariant == "readable-after-heal", result.summary()


STORMS = [1732814, 1732848]


@pytest.mark.parametrize("seed", STORMS)
def test_a_resigned_leader_holding_off_is_designated_anew_once(seed: int) -> None:
    result = run_seed(config_for(seed, "pools"))
    assert result.ok, result.report()


@pytest.mark.parametrize("seed", STORMS)
def test_without_designating_once_a_record_is_written_at_every_plan(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    take_out(["designate-once"], monkeypatch.setattr)
    result = run_seed(config_for(seed, "pools"))
    assert result.violation is not None, result.summary()
    assert result.violation.invariant == "record-write-storm", result.summary()
