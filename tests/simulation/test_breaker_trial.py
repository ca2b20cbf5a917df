"""The simulation's seeds that found a gateway refusing a node for good: they hold.

Once the simulation's gateway ran the production request loop (``PartitionCalls.call``, with
its circuit breaker per node; session 33), ``restore`` seeds 30325 and 30355 left a FIFO
group taking no send for 30 s after healing: the half-open trial request to n1 was held
at a leader the map then showed replaced and was given up (sent to the new leader), with no
verdict on n1, so the breaker kept its trial out for good and refused every later request
to n1, and n1 led that partition. A trial that ends without a verdict now hands the trial on
(``client/node_health.py``, ``Breaker.abandon``).

Later fixes moved 30325's trajectory off the race; session 35 re-found it with ``abandon``
disabled, on its final tree: ``restore`` 31085, 32042 and 32199 fail without it and hold
with it. Session 39's hand-over and first-entry fixes moved those off the race too; with
them taken out as well (``BACK_ON_THE_RACE``), 31085 and 32042 fail again.

On production's ``Node`` (issue 49) the seed no longer reaches the race with the fix taken
out either; the fix is shown to matter by the deterministic tests test_fixes_pinned.py
runs without it (docs/testing.md, "Fixes pinned by deterministic tests").
"""

from __future__ import annotations

import pytest

from .simulation import config_for, run_seed

FOUND = [30325, 30355, 31085, 32042, 32199]


@pytest.mark.parametrize("seed", FOUND)
def test_a_node_whose_trial_was_given_up_is_tried_again(seed: int) -> None:
    result = run_seed(config_for(seed, "restore"))
    assert result.ok, result.report()
