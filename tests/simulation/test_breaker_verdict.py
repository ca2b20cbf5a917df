"""The simulation's seeds that found a request sleeping out a breaker's cool-down after the
node's trial had succeeded.

``minority`` 400087 and 401977 (found by session 38's sweep; they fail on session 37's code
too). A partition's leader was killed and restarted; once it led again (a newer term), one
request went to it as the breaker's trial and succeeded in 3 ms, while another, refused just
before with the rest of a doubled cool-down as its ``retry_after_s``, slept that out: 1.8 s
more, a send waiting 3.7 s against the 3 s bound (``minority-fault-availability``). A
refused request now also wakes at the node's next verdict (``client/node_health.py``,
``Breaker.verdict``; the rule alone in tests/cluster/test_routing.py).

Session 39's fixes for 400568 and 400730 (test_minority_hand_over.py) moved both seeds off
the race; with those two taken out they are back on it, and fail only without this fix.
Session 42's revoke of a lost lease moved 400087 off it again: it is taken out too. So did
issue 48's ``wakes-with-entries`` (a link's sender woken only with entries to ship), both
seeds: taken out too.

On production's ``Node`` (issue 49) the seed no longer reaches the race with the fix taken
out either; the fix is shown to matter by the deterministic tests test_fixes_pinned.py
runs without it (docs/testing.md, "Fixes pinned by deterministic tests").
"""

from __future__ import annotations

import pytest

from .ablations import take_out
from .simulation import config_for, run_seed

FOUND = (400087, 401977)
THE_LATER_FIXES = ["handover-answer", "first-entry-task", "revoke-lost-lease", "wakes-with-entries"]


@pytest.mark.parametrize("seed", FOUND)
def test_a_refused_request_goes_once_the_nodes_trial_succeeded(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    take_out(THE_LATER_FIXES, monkeypatch.setattr)
    result = run_seed(config_for(seed, "minority"))
    assert result.ok, result.report()


@pytest.mark.parametrize("seed", FOUND)
def test_the_seeds_hold_on_the_final_code(seed: int) -> None:
    result = run_seed(config_for(seed, "minority"))
    assert result.ok, result.report()
