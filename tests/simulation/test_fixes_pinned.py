"""Each fix the simulation found is pinned by deterministic tests that fail without it.

A fix's own simulation test runs its seed with the fix in (it must hold), and used to run it
with the fix taken out as well (it had to fail). Since the simulation builds production's
``Node`` (issue 49) those seeds no longer reach their races, and a sweep of 2,691 seeds of
mix ``all`` (600000 onward) with all of these fixes out at once found none that needed one
of them (docs/testing.md, "Fixes pinned by deterministic tests"). The proof that each fix
matters is now a deterministic test: a unit test of the rule on production's code, a real
component (``test_new_term.py``'s partition hosts, ``test_one_entry_per_lsn_and_epoch.py``'s
LMDB store), or, where the ablation takes the rule out of the simulation's etcd model, a
test of that model (``test_sim_coordinator.py``; the real-etcd side is
``tests/cluster/test_coordinator.py``). Here each fix is taken out (``without_fixes.py``)
in a pytest of its own, and every test that pins it must fail; without the ablation the
same tests run, and pass, in the suite itself.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .ablations import ABLATIONS
from .without_fixes import WITHOUT_ENV

REPO = Path(__file__).resolve().parents[2]
ROUTING = "tests/cluster/test_routing.py"
WATCHES = "tests/cluster/test_manager_watches.py"
MODEL = "tests/simulation/test_sim_coordinator.py"
REMADE = "tests/cluster/test_remade_copies.py"
SETS = "tests/cluster/test_served_sets.py"

# The fix taken out -> the tests that pin it (each fails without it).
PINNED_BY: dict[str, tuple[str, ...]] = {
    "breaker-abandon": (f"{ROUTING}::test_a_trial_given_up_without_a_verdict_hands_the_trial_on",),
    "breaker-verdict": (f"{ROUTING}::test_a_request_the_breaker_refused_wakes_at_the_nodes_next_verdict",),
    "claim-compares": (
        f"{MODEL}::test_a_claim_on_a_record_that_changed_is_refused",
        f"{MODEL}::test_a_claim_on_a_cluster_record_that_changed_is_refused",
        f"{MODEL}::test_a_key_of_ones_own_lease_on_a_changed_record_is_given_up_not_won",
    ),
    "claim-cluster-compare": (f"{MODEL}::test_a_claim_on_a_cluster_record_that_changed_is_refused",),
    "own-key-compares": (f"{MODEL}::test_a_key_of_ones_own_lease_on_a_changed_record_is_given_up_not_won",),
    "publish-check": (f"{MODEL}::test_registering_says_what_the_write_replaced_and_its_own_revision",),
    "leader-sightings": (
        f"{WATCHES}::test_a_leader_key_seen_is_remembered_after_it_vanishes_and_older_positions_do_not_count",
    ),
    "fresh-read": (
        f"{WATCHES}::test_a_manager_that_wins_reads_every_prefix_afresh_over_its_watches_older_states",
    ),
    "repair-marks": (f"{WATCHES}::test_a_commit_the_watch_spoke_during_leaves_the_watchs_marks",),
    "record-expectations": (f"{WATCHES}::test_a_commit_expects_the_partition_records_its_plan_was_made_on",),
    "reread-written": (
        f"{WATCHES}::test_a_refused_commit_takes_what_etcd_holds_over_the_managers_own_lost_write",
    ),
    "hold-written": (f"{WATCHES}::test_a_commit_the_restore_lost_is_taken_back_from_etcd_by_the_watches",),
    "record-rebuild": (
        "tests/cluster/test_unreadable_records.py::test_a_manager_that_never_read_a_record_writes_back_what_its_leader_serves_on",
        "tests/cluster/test_unreadable_records.py::test_without_a_leader_the_rebuilt_record_designates_nobody_until_every_copy_counts",
    ),
    "served-sets": (
        f"{SETS}::test_after_a_restore_a_majority_of_each_earlier_set_is_heard_before_a_promotion",
        f"{SETS}::test_a_member_that_deleted_its_copy_on_a_move_counts_when_the_best_copy_covers_its_receipt",
    ),
    "remade-copies": (f"{REMADE}::test_only_an_empty_copy_of_the_same_queues_partition_is_remade",),
    "receipt-majority": (
        f"{REMADE}::test_a_majority_of_the_receipts_set_heard_lets_the_best_copy_anywhere_lead",
    ),
    "receipt-chain": (
        f"{REMADE}::test_a_receipts_set_that_moved_on_is_followed_to_its_members_newer_receipt",
    ),
    "moved-away-members": (
        f"{REMADE}::test_a_member_of_the_receipts_set_that_moved_its_copy_away_counts_when_the_best_copy_covers_it",
        f"{SETS}::test_a_member_that_deleted_its_copy_on_a_move_counts_when_the_best_copy_covers_its_receipt",
    ),
    "unread-bound": (
        "tests/cluster/test_reconcile.py::test_a_tombstone_with_a_bound_waits_until_the_replicas_last_lsn_is_read",
    ),
    "handover-answer": (
        "tests/cluster/test_new_term.py::test_a_hand_over_begins_once_the_successor_answered_after_it_was_asked",
    ),
    "first-entry-task": (
        "tests/cluster/test_new_term.py::test_a_leader_no_follower_answers_starts_at_once_and_check_quorum_can_end_it",
    ),
    "behind-own-key": (
        "tests/cluster/test_leadership.py::test_a_replica_resigning_behind_a_voter_first_deletes_its_own_standing_key",
    ),
    "wait-voter-ahead": (
        "tests/cluster/test_manager_plan.py::test_a_resigned_leader_is_not_designated_again_over_a_live_voter_ahead_of_it",
    ),
    "designate-once": (
        "tests/cluster/test_manager_plan.py::test_a_resigned_leader_is_designated_anew_once_per_resignation",
    ),
    "term-fence": (
        "tests/cluster/test_one_entry_per_lsn_and_epoch.py::test_a_write_queued_under_a_deposed_term_is_never_logged_in_the_next",
    ),
}


def test_every_pinned_fix_is_an_ablation() -> None:
    assert set(PINNED_BY) <= set(ABLATIONS)


@pytest.mark.parametrize("fix", sorted(PINNED_BY))
def test_without_the_fix_every_test_that_pins_it_fails(fix: str) -> None:
    tests = PINNED_BY[fix]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.simulation.without_fixes",
            *tests,
        ],
        cwd=REPO,
        env={**os.environ, WITHOUT_ENV: fix},
        capture_output=True,
        text=True,
        timeout=120,
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    failed = re.search(r"(\d+) failed", summary)
    assert failed is not None and int(failed.group(1)) == len(tests), (fix, summary, done.stdout[-3000:])
    assert "passed" not in summary and "error" not in summary, (fix, summary)
