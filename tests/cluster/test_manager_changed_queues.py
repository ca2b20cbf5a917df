"""The manager takes the queue records that changed from the watch's events when it holds the
state they were applied to, and compares every record otherwise (manager.py ``_changed``)."""

from __future__ import annotations

from backend_store.cluster.coordination.coordinator import Entry, PrefixState
from backend_store.cluster.manager.manager import _changed

P = "/pushgate/queues/"


def entry(name: str, value: bytes, revision: int) -> Entry:
    return Entry(P + name, value, revision, revision)


def test_the_watch_s_keys_are_taken_when_they_follow_the_state_held() -> None:
    before = PrefixState(P, 10, {P + "t/a": entry("t/a", b"a", 5), P + "t/b": entry("t/b", b"b", 10)})
    entries = {**before.entries, P + "t/c": entry("t/c", b"c", 11)}
    after = PrefixState(P, 11, entries, changed=frozenset({P + "t/c"}), since=10)
    assert _changed(before, after) == {P + "t/c"}


def test_every_record_is_compared_when_the_keys_follow_another_state() -> None:
    before = PrefixState(P, 9, {P + "t/a": entry("t/a", b"a", 5)})
    entries = {P + "t/a": entry("t/a", b"a2", 10), P + "t/c": entry("t/c", b"c", 11)}
    # Applied to revision 10, a state this manager never took (it skipped it, or read
    # etcd itself since): the keys it names are not all that changed since its own.
    after = PrefixState(P, 11, entries, changed=frozenset({P + "t/c"}), since=10)
    assert _changed(before, after) == {P + "t/a", P + "t/c"}
    # A whole read (no keys named) is compared too.
    assert _changed(before, PrefixState(P, 11, entries)) == {P + "t/a", P + "t/c"}
