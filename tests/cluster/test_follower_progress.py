"""FollowerProgress, sans I/O: what a leader's link counts as held by a follower (towards a
majority) and as in flight (the shipping window), through position reports, refusals and
acknowledgements.

Issue 24's restarted follower that never caught up: a follower the leader knew nothing of
(its record expired while it was down, or a new term) reported LSN 2470; counted from an
acknowledged LSN of 0, all of it was "in flight", past the 2048-entry window, so nothing was
shipped, and the answer of an idle heartbeat, which would have moved it, never came under
steady writes (``test_replication.py`` and ``test_follower_catch_up.py`` show the link and
the nodes).
"""

from __future__ import annotations

from backend_store.cluster.replication.log_shipping import FollowerProgress
from backend_store.types import Lsn

WINDOW = 2048


def test_a_follower_met_past_the_window_has_nothing_in_flight_and_holds_nothing_for_us() -> None:
    progress = FollowerProgress("n2")
    progress.ship_from(Lsn(2470))  # its position report on a new link
    assert progress.positioned and progress.sent == 2470
    assert progress.in_flight == 0 < WINDOW  # so the leader ships from 2470 at once
    # Not counted towards a majority: that position may hold a deposed leader's entries.
    assert progress.acked == 0


def test_shipping_fills_the_window_and_acknowledgements_empty_it() -> None:
    progress = FollowerProgress("n2")
    progress.ship_from(Lsn(2470))
    progress.sent = Lsn(2470 + WINDOW)  # shipped a window's worth
    assert progress.in_flight == WINDOW
    progress.acknowledge(Lsn(2470 + 256))
    assert progress.acked == progress.answered == 2470 + 256
    assert progress.in_flight == WINDOW - 256


def test_an_acknowledgement_counts_no_further_than_what_was_shipped() -> None:
    # A rejoining deposed leader's answer names its own longer tail: not ours, not held.
    progress = FollowerProgress("n2")
    progress.ship_from(Lsn(10))
    progress.sent = Lsn(12)
    progress.acknowledge(Lsn(40))
    assert progress.acked == progress.answered == 12
    assert progress.in_flight == 0


def test_a_refusal_steps_back_without_leaving_anything_in_flight() -> None:
    progress = FollowerProgress("n2")
    progress.ship_from(Lsn(3000))
    progress.sent = Lsn(3000 + WINDOW)
    progress.acknowledge(Lsn(3100))
    # "I vouch for my log only up to 2999": ship again from there.
    progress.ship_from(Lsn(2999))
    assert (progress.sent, progress.answered, progress.acked) == (2999, 2999, 2999)
    assert progress.in_flight == 0


def test_a_position_report_never_raises_what_counts_as_held() -> None:
    progress = FollowerProgress("n2")
    progress.ship_from(Lsn(5))
    progress.sent = Lsn(9)
    progress.acknowledge(Lsn(9))
    progress.ship_from(Lsn(20))  # the next link's report: past what it acknowledged to us
    assert progress.acked == 9 and progress.in_flight == 0
    progress.ship_from(Lsn(7))  # a re-seed or a truncation took it back
    assert progress.acked == 7 and progress.in_flight == 0
