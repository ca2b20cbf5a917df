"""The simulation's seed that found a resignation outliving the term that ended it.

``returns`` 2652 (session 38): n2 resigned p4 for lack of a quorum at epoch 12, vouching for
LSN 10. After a restore, n3 led a newer term and n2 acknowledged LSNs 11-16 under it; but n2's
node loop saw n3's key only while it held off on a designation from before the restore, and
that hold-off did not end the resignation. n2 kept publishing "resigned at LSN 10", and when
n3 died the manager promoted n4 (LSN 15) over it (``leader-completeness``). A resignation now
ends on a newer term's key whatever the replica does meanwhile, and on entries of a newer
term than it held (``node/leadership.py``; the rule alone in tests/cluster/test_leadership.py).
The fault mix is not what matters here: ``returns`` was merely the sweep that found it.

No seed pins the rule any more (session 40). Session 39's fixes moved 2652 off the race, and
taking them out as well does not put it back (``ablations.BACK_ON_THE_RACE``); sweeps with
the rule taken out found no other seed: ``returns`` 2000-2399 and 10000-11199 without it,
8000-8999 without it and session 39's fixes (2,600 seeds). The rule is tested as a pure
function instead (tests/cluster/test_leadership.py,
``test_a_resignation_ends_on_entries_of_a_newer_term_and_while_holding_off``, which fails
with the ablation ``resignation-ends`` applied); the seed stays as one that must hold.
"""

from __future__ import annotations

from .simulation import config_for, run_seed

FOUND = 2652


def test_a_replica_that_acknowledged_a_newer_term_stops_vouching_for_its_old_position() -> None:
    result = run_seed(config_for(FOUND, "returns"))
    assert result.ok, result.report()
