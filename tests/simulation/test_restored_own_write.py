"""A manager's own write, lost to an etcd restore that its watch cannot see.

``restore`` 1758509 at the 1 s lease (found by session 85's sweep, fixed in session 86):
m1 moved partition 1's leadership to n3 (a record naming n3 its successor) at t=18.6 and
put the record it wrote into its view at once, as it does with every commit of its own.
etcd was restored at t=18.8 from a backup of t=18.4, which held the record as it was
before, which is also the state of the partitions the manager's watch had last brought:
the watch, which yields only a state other than the one held, brought nothing. Every plan
then expected the lost record, every commit failed, and the manager planned again four
times a second for the rest of the run; the promotions of partitions 1-3 never landed and
q0g0 took no send for 30 s after healing (``available-after-heal``). A commit that finds
etcd other than the view now reads the prefixes the manager writes afresh
(``Manager._read_written``).

With the fresh read taken out (ablation ``reread-written``) the seed failed again, until the
same session's nodes (a voter counts towards a campaign once it wrote its record since)
moved it off the race, and no seed of ``restore`` 1759600-1759999 at the 1 s lease reaches it
without the fix; the fix is pinned by a deterministic test instead
(``tests/cluster/test_manager_watches.py``, in ``test_fixes_pinned.py``). The seed stays as
one that must hold.
"""

from __future__ import annotations

from .simulation import config_for, run_seed

SEED = 1758509


def test_a_manager_plans_again_on_what_a_restored_etcd_holds() -> None:
    result = run_seed(config_for(SEED, "restore", lease_ttl_s=1.0))
    assert result.ok, result.report()
    assert any(fact.kind == "etcd-restored" for fact in result.facts), result.summary()
