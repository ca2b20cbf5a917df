"""A watch's states share their unchanged entries (``prefix_entries.py``): each state must read
exactly as a dict of its keys would, and deriving a new one must leave every earlier one as
it was, since listeners keep them (``WatchedPrefix`` compares the held state with the next)."""

from __future__ import annotations

import random

import pytest

from backend_store.cluster.coordination.coordinator import Entry, PrefixState
from backend_store.cluster.coordination.prefix_entries import MERGE_AT_LEAST, LayeredEntries, layered
from backend_store.cluster.coordination.watched_prefix import changed_keys


def entry(key: str, revision: int) -> Entry:
    return Entry(key, f"{key}@{revision}".encode(), revision, revision)


def assert_reads_as(mapping: LayeredEntries, model: dict[str, Entry]) -> None:
    assert len(mapping) == len(model)
    assert sorted(mapping) == sorted(model)
    assert dict(mapping.items()) == model
    assert sorted(mapping.values(), key=lambda e: e.key) == sorted(model.values(), key=lambda e: e.key)
    assert mapping == model and model == mapping
    for key in [*model, "absent", "k-1"]:
        assert (key in mapping) == (key in model)
        assert mapping.get(key) == model.get(key)
    assert not mapping.__contains__(7)  # not a key at all


@pytest.mark.parametrize("seed", range(40))
def test_every_state_reads_as_a_dict_and_no_earlier_state_changes(seed: int) -> None:
    rng = random.Random(seed)
    keys = [f"k{i}" for i in range(rng.choice([3, 50, 400]))]
    model = {key: entry(key, 1) for key in keys if rng.random() < 0.7}
    state = layered(dict(model))
    kept: list[tuple[LayeredEntries, dict[str, Entry]]] = [(state, dict(model))]
    revision = 1
    for _ in range(rng.choice([10, 300, 1500])):
        changes: list[tuple[str, Entry | None]] = []
        for _ in range(rng.choice([1, 1, 1, 3, 20])):  # a response carries one event or several
            revision += 1
            key = rng.choice(keys)
            if rng.random() < 0.3:
                changes.append((key, None))
                model.pop(key, None)
            else:
                model[key] = put = entry(key, revision)
                changes.append((key, put))
        state = state.changed(changes)
        assert_reads_as(state, model)
        if rng.random() < 0.05:
            kept.append((state, dict(model)))
    for earlier, then in kept:
        assert_reads_as(earlier, then)


def test_changes_merge_into_a_new_base_so_a_derivation_stays_small() -> None:
    base = {f"k{i}": entry(f"k{i}", 1) for i in range(10_000)}
    state = layered(base)
    for revision in range(2, 2_000):
        state = state.changed([(f"k{revision}", entry(f"k{revision}", revision))])
        assert len(state._over) <= max(MERGE_AT_LEAST, 142)  # sqrt(2 * 10,000) = 141
    assert base["k5"] == entry("k5", 1)  # the read's dict is shared, never changed


def test_a_watch_state_compares_with_a_read_of_the_same_keys() -> None:
    read = PrefixState("/p/", 5, {"/p/a": entry("/p/a", 4), "/p/b": entry("/p/b", 5)})
    watched = PrefixState(
        "/p/", 6, layered(read.entries).changed([("/p/a", entry("/p/a", 6)), ("/p/b", None)])
    )
    assert changed_keys(read, watched) == {"/p/a", "/p/b"}
    assert watched.values() == {"a": b"/p/a@6"}
    assert PrefixState("/p/", 6, {"/p/a": entry("/p/a", 6)}) == watched
