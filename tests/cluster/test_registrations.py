"""Which nodes a node has heard from since it registered (``node/registrations.py``), without
etcd: a record a restore brought back under its old lease is no sign of life."""

from __future__ import annotations

from backend_store.cluster.coordination.coordinator import Entry, PrefixState
from backend_store.cluster.node.registrations import Registrations

PREFIX = "/pushgate/nodes/"


def nodes(revision: int, *records: tuple[str, int, int, int]) -> PrefixState:
    """A ``nodes/`` state of (node id, create revision, mod revision, lease) records."""
    entries = {PREFIX + n: Entry(PREFIX + n, b"", create, mod, lease) for n, create, mod, lease in records}
    return PrefixState(PREFIX, revision, entries)


def test_relics_a_restore_brought_back_are_not_heard_and_live_nodes_write_again() -> None:
    # Simulation seed ``down`` 38 (session 86): etcd restored from a backup with its revisions
    # bumped; n2's and n3's records are the backup's, under the backup's leases.
    mine = Registrations("n1")
    relics = [("n2", 10, 12, 0x1003), ("n3", 11, 13, 0x1002)]
    assert mine.heard() == {"n1"}  # not registered yet: nobody else is heard
    mine.registered(1091)
    assert mine.observe(nodes(1091, ("n1", 1091, 1091, 0x1009), *relics))  # new to this process
    assert mine.heard() == {"n1"}
    # n3 starts, registers under a new lease: n2 (live) would write its record again for it.
    theirs = Registrations("n2")
    theirs.registered(1092)
    theirs.observe(nodes(1092, ("n2", 1092, 1092, 0x100A)))
    assert theirs.observe(nodes(1095, ("n2", 1092, 1092, 0x100A), ("n3", 1095, 1095, 0x100B)))
    assert not theirs.observe(nodes(1096, ("n2", 1092, 1096, 0x100A), ("n3", 1095, 1095, 0x100B)))
    # n3's record, written after n1 registered, is heard; n2's relic still is not.
    mine.observe(nodes(1095, ("n1", 1091, 1091, 0x1009), relics[0], ("n3", 1095, 1095, 0x100B)))
    assert mine.heard() == {"n1", "n3"}


def test_an_etcd_gone_back_to_before_the_registration_is_heard_from_then_on() -> None:
    # Restored (revisions not bumped) while the node ran: its registration's revision is
    # past etcd's; what is written from now on is heard, what the restore brought back not.
    mine = Registrations("n1")
    mine.registered(140)
    mine.observe(nodes(150, ("n1", 140, 140, 1), ("n2", 90, 145, 2)))
    assert mine.heard() == {"n1", "n2"}
    mine.observe(nodes(135, ("n1", 100, 100, 1), ("n2", 90, 120, 2)))
    assert mine.heard() == {"n1"}
    mine.observe(nodes(137, ("n1", 100, 100, 1), ("n2", 90, 137, 2)))
    assert mine.heard() == {"n1", "n2"}
