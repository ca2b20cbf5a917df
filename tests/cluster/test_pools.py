"""Placement on shared partitions (coordination/pools.py): what every gateway and the
simulation compute alike."""

from __future__ import annotations

from collections import Counter

import pytest

from backend_store.cluster.coordination.layout import PartitionRecord
from backend_store.cluster.coordination.pools import PoolRequest, deleting, place, placement, pool_name
from backend_store.errors import InvalidRequest, Unavailable


def test_a_queue_is_placed_on_consecutive_distinct_slots_the_same_way_everywhere() -> None:
    slots = [11, 12, 13, 14, 15, 16, 17, 18]
    first = place("acme", "inbox-42", 3, slots)
    assert first == place("acme", "inbox-42", 3, list(slots))  # deterministic
    assert len(set(first)) == 3
    start = slots.index(first[0])
    assert first == tuple(slots[(start + i) % len(slots)] for i in range(3))
    # The tenant counts: the same name in another tenant may land elsewhere.
    assert {place(t, "inbox", 1, slots) for t in ("a", "b", "c", "d", "e", "f", "g", "h")} != {first[:1]}


def test_many_queues_spread_evenly_over_a_pool() -> None:
    slots = list(range(100, 108))
    counts = Counter(place("tenant", f"user-{i}", 1, slots)[0] for i in range(8000))
    assert set(counts) == set(slots)
    assert max(counts.values()) < 1.15 * 1000 and min(counts.values()) > 0.85 * 1000


def test_a_queue_asking_for_more_partitions_than_the_pool_has_wraps_around_it() -> None:
    slots = [21, 22, 23]
    wide = place("t", "wide", 8, slots)
    assert len(wide) == 8 and set(wide) == set(slots)
    assert all(wide[i] == wide[i + 3] for i in range(5))  # index i and i + 3 share a partition
    assert wide[:3] == place("t", "wide", 3, slots)  # the same start as a narrower queue's
    with pytest.raises(Unavailable):
        place("t", "wide", 1, [])  # no pool yet


def test_pool_records_and_requests() -> None:
    assert pool_name(3, "sync") == "rf3-sync"
    with pytest.raises(InvalidRequest):
        pool_name(3, "eventual")
    request = PoolRequest(3, "async", min_partitions=16)
    assert PoolRequest.unpack(request.pack()) == request and request.name == "rf3-async"
    pool = PartitionRecord("", "rf3-sync", 2, ("n1", "n2", "n3"), "n1")
    assert PartitionRecord.unpack(pool.pack()).pool == "rf3-sync"
    assert PartitionRecord("acme", "inbox", 0, ("n1",), "n1").pool is None


def test_queue_record_fields() -> None:
    assert placement({"partitions": 1}) is None  # a queue made before pools
    assert placement({"placement": [4, 7]}) == (4, 7)
    assert deleting({"deleting": True}) and not deleting({}) and not deleting({"deleting": "yes"})
