"""The simulation with a small shipping window: the seeds that found issue 24's follower that
never caught up hold.

A run ships a few hundred entries, so production's 2,048-entry window is never reached and
the window's bookkeeping goes untested by the CI seeds (``test_simulation.py``). With a
window of 8 (``scripts/simulate --window 8``), ``minority`` seeds 22 and 33 broke
``minority-fault-availability`` on the code before the fix (3.7 s and 3.1 s): a new leader's
followers reported positions past the window, which the leader counted as in flight from an
acknowledged LSN of 0, so it shipped them nothing until an idle heartbeat's answer, and
under steady sends every commit woke the sender before one was due (the real-process
random-fault test's seed 2 showed the same bookkeeping leaving a restarted follower behind
for good; docs/testing.md).
"""

from __future__ import annotations

import pytest

from .simulation import config_for, run_seed

SMALL_WINDOW = 8
FOUND_IT = [("minority", 22), ("minority", 33)]


@pytest.mark.parametrize(("mix", "seed"), FOUND_IT, ids=[f"{m}-{s}" for m, s in FOUND_IT])
def test_a_small_window_holds_on_the_seeds_that_found_the_stalled_follower(mix: str, seed: int) -> None:
    result = run_seed(config_for(seed, mix, window_entries=SMALL_WINDOW))
    assert result.ok, (
        f"{result.summary()}\nreplay: scripts/simulate --seed {seed} --faults {mix} --window {SMALL_WINDOW}\n"
        f"{result.trace_text(40)}"
    )
    assert result.acked > 0
