"""Failover stays as quick after supervisors' restarts (issue 48, item 2): real etcd, three
real ``pushgate node`` processes and two managers, 16 producers of plain sends through a
gateway's ``ClusterBackend``.

The reported sequence: twice "SIGKILL the leader of a new queue under load, then restart that
node with its own command line" (here once after sends resumed, once 0.3 s after the kill),
then a SIGSTOP of the leader of another new queue for 6 s.
On a fresh cluster a frozen leader was replaced in about 2 s; after the two restarts no send
succeeded until it was resumed. Every round must fail over within 3 s (the issue's bound:
a 2 s lease, then the promotion), measured from a moment taken before the signal.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import scaled
from tests.fixtures.etcd_server import unique_prefix

from .failover_rounds import failover_round
from .processes import ClusterHarness

BOUND_S = 3.0


@pytest.fixture
async def harness(etcd_endpoints: list[str], tmp_path: Path) -> AsyncIterator[ClusterHarness]:
    h = ClusterHarness(etcd_endpoints, tmp_path, unique_prefix("restarts") + "/")
    try:
        yield await h.start(nodes=3, managers=2)
    finally:
        await h.close()


async def test_kill_restart_kill_restart_freeze_each_fail_over_within_the_bound(
    harness: ClusterHarness,
) -> None:
    # The first killed node comes back once sends resumed, the second 0.3 s after its kill
    # (a supervisor's restart, while its old lease still holds its keys).
    rounds = []
    for i, (sig, restart_after_s) in enumerate(
        [(signal.SIGKILL, None), (signal.SIGKILL, 0.3), (signal.SIGSTOP, None)]
    ):
        done = await failover_round(
            harness, f"q{i}", sig, producers=16, hold_s=6.0, restart_after_s=restart_after_s
        )
        rounds.append(done)
        assert done.took_s <= scaled(BOUND_S), (
            "\n".join(map(str, rounds)) + f"\n{await harness.summary()}{harness.logs()}"
        )


async def test_a_queue_created_while_a_node_restarts_fails_over_once_it_is_back(
    harness: ClusterHarness,
) -> None:
    # The recipe that reproduced the report: a node down (killed, its lease run out) when a
    # new RF 3 queue is created, so the queue is placed on the other two; the node is
    # started again, and once it is registered the queue's leader is frozen for 6 s. With
    # two voters the other one alone is no majority: before the fix nothing was promoted
    # until the thaw (6.0-6.5 s), as the new voter joined only ~9 s after the restart.
    down = "n2"
    harness.nodes[down].kill()

    async def expired() -> bool:
        return down not in await harness.node_records()

    await harness.wait_for(f"{down}'s record to expire", expired)
    done = await failover_round(harness, "q", signal.SIGSTOP, producers=16, hold_s=6.0, returning=down)
    assert done.took_s <= scaled(BOUND_S), f"{done}\n{await harness.summary()}{harness.logs()}"
