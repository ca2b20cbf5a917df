"""The simulation's seed that found a manager planning on a view from before it led.

``all`` 101788 (session 35): n3 led partition 3 and was cut from etcd; its lease expired,
m1 promoted n5, and n5 committed LSNs 22-24 with n4. etcd then went down; when it came back
every lease had expired and m2 won the manager key, with watches still showing the nodes
as they were before m2 itself had been cut off: n3's old record, serving p3 as leader.
``follow_key_holder`` took it for a node holding the key and designated n3, which claimed the
free key on that designation and led epoch 211 from LSN 21 (``leader-completeness``). A
manager now reads every prefix afresh once it leads, before its first plan, and drops
watched states read before its election (``Manager._read_everything``).

On production's ``Node`` (issue 49) the seed no longer reaches the race with the fix taken
out either; the fix is shown to matter by the deterministic tests test_fixes_pinned.py
runs without it (docs/testing.md, "Fixes pinned by deterministic tests").
"""

from __future__ import annotations

from .simulation import config_for, run_seed

SEED = 101788


def test_a_new_manager_does_not_plan_on_a_view_from_before_it_led() -> None:
    result = run_seed(config_for(SEED, "all"))
    assert result.ok, result.report()
