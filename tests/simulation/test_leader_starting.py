"""The simulation's seeds that found a gateway waiting 0.5 s on a leader that was starting its
term: they hold within 2.2 s.

After a failover the new leader's key is in etcd, and so in the gateway's map, a moment
before the leader serves (its term starts: a no-op entry committed by a majority). A request
in that moment is answered ``not_leader`` with no newer leader named, and the gateway then
waited up to 0.5 s for the map to move; but no move comes, the map already shows the leader,
so every such request waited out the 0.5 s. The real-process random-fault test measured the
same 0.4-0.65 s between the new leader's start and the first acknowledged send (session 33,
with a traced client). ``minority`` seeds 16, 19 and 38 waited 2.3 s each under one
minority fault; the gateway now asks again after 25 ms, doubling up to 0.5 s
(``client/partition_calls.py``), and they wait 1.8, 1.9 and 0 s (seeds 5, 18 and 24 showed
the same before the model of etcd's client re-opened each watch on its own timer, which
changed every trace). The bound here is tighter than the mix's 3 s so that the seeds keep
their power to find the wait. Session 35's manager changes moved 16 off it; with the fixed
wait, ``minority`` 6, 11 and 14 (among others of 0-199) fail, and hold without it.
"""

from __future__ import annotations

import pytest

from .ablations import BACK_ON_THE_RACE, take_out
from .simulation import config_for, run_seed

BOUND_S = 2.2
FOUND = [16, 19, 38, 6, 11, 14]
WITH_A_FIXED_WAIT_FAIL = [6, 11, 14]


@pytest.mark.parametrize("seed", FOUND)
def test_sends_resume_promptly_once_a_new_leader_serves(seed: int) -> None:
    result = run_seed(config_for(seed, "minority", availability_bound_s=BOUND_S))
    assert result.ok, (
        f"{result.summary()}\nreplay: scripts/simulate --seed {seed} --faults minority --bound {BOUND_S}\n"
        f"{result.trace_text(40)}"
    )


def test_the_seed_still_finds_a_fixed_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the gateway's first wait after ``not_leader`` back at 0.5 s, the seeds fail again
    (any one is enough: a later change may move one seed's trajectory off the wait): the
    test above would catch that wait coming back."""
    take_out([*BACK_ON_THE_RACE, "not-leader-wait"], monkeypatch.setattr)
    summaries = [
        run_seed(config_for(seed, "minority", availability_bound_s=BOUND_S)).summary()
        for seed in WITH_A_FIXED_WAIT_FAIL
    ]
    assert any("minority-fault-availability" in summary for summary in summaries), summaries
