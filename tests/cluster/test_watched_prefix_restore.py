"""What a watched prefix's listeners hear after etcd went back in time (no I/O: states are
handed to ``WatchedPrefix.apply`` as its watch would).

An etcd restored from a snapshot numbers its revisions again from the snapshot's, so a key
can hold another value at a mod revision it held before. The simulation's seed ``restore``
1740213 (session 74, ``available-after-heal``; ``tests/simulation/test_reused_revision.py``
runs it): a restore brought back n3's leader
key of p1 at the revision n2's key had been written at since; the nodes' listeners were not
told, n2 kept deleting "its" key, which etcd did not hold, and the manager waited for n3 to
serve for good.
"""

from __future__ import annotations

from typing import cast

from backend_store.cluster.coordination.coordinator import Coordinator, Entry, PrefixState
from backend_store.cluster.coordination.watched_prefix import WatchedPrefix, changed_keys

PREFIX = "/pushgate/leaders/"
KEY = PREFIX + "1"


def state(revision: int, holder: bytes, mod_revision: int) -> PrefixState:
    return PrefixState(PREFIX, revision, {KEY: Entry(KEY, holder, mod_revision, mod_revision, 7)})


def test_a_key_holding_another_value_at_the_same_mod_revision_is_a_change() -> None:
    before, restored = state(60, b"n2", 45), state(62, b"n3", 45)
    assert changed_keys(before, restored) == {KEY}
    assert changed_keys(before, state(62, b"n2", 45)) == set()


async def test_listeners_hear_a_restored_key_written_at_a_revision_it_had_before() -> None:
    heard: list[tuple[int, set[str]]] = []
    watched = WatchedPrefix(cast(Coordinator, None), PREFIX)  # no watch started: states applied by hand
    watched.add_listener(lambda s, keys: heard.append((s.revision, keys)))
    watched.apply(state(60, b"n2", 45))
    # etcd restored, then written past the held revision: a newer state, not a "went back".
    watched.apply(state(62, b"n3", 45))
    assert heard == [(60, {KEY}), (62, {KEY})]
    assert watched.state.entries[KEY].value == b"n3"
