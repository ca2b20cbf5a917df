"""The simulation's seed that found a hand-over's successor passed over: it holds.

``minority`` 40624 (session 33's last sweep): a rebalancing asked n1 to hand p3 over to n3;
n1 gave its key up, and 8 ms later the manager promoted n2, not n3: n2 and n1 had published
positions after the key vanished, n3 not yet, and n2 was as up to date, but it had been cut
off from its peers 1.2 s before, so it led a partition it could not replicate, and a send
waited 4.2 s, until the heal (``minority-fault-availability``). The manager now waits for a
live successor's fresh position (``manager/election.py``, ``promote``);
``tests/cluster/test_manager_plan.py`` pins the rule.
"""

from __future__ import annotations

from .simulation import config_for, run_seed


def test_a_hand_over_goes_to_its_successor() -> None:
    result = run_seed(config_for(40624, "minority"))
    assert result.ok, result.report()
