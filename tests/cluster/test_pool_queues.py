"""Which queues a pool partition's leader serves, keeps and deletes, and what a change to
one record costs (node/pool_queues.py; docs/cluster.md, "Shared partitions"), without I/O:
the store is two recording callables."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from backend_store.cluster.coordination import pools
from backend_store.cluster.coordination.coordinator import Entry, PrefixState
from backend_store.cluster.coordination.layout import PartitionRecord, pack
from backend_store.cluster.coordination.queue_record import store_attributes
from backend_store.cluster.node.pool_queues import PoolQueues, QueueKey, QueueRecords, Want, ready_or_applied

PREFIX = "/pushgate/queues/"
SLOT_1 = PartitionRecord("", "rf3-sync", 1, ("n1", "n2", "n3"), "n1")


def doc(*placement: int, deleting: bool = False, **attributes: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"replication_factor": 3, **attributes}
    if placement:
        out[pools.PLACEMENT] = list(placement)
    if deleting:
        out[pools.DELETING] = True
    return out


class Store:
    """What a pool partition's store was asked to do, in order."""

    def __init__(self, failing: set[QueueKey] | None = None) -> None:
        self.calls: list[tuple[str, QueueKey]] = []
        self.failing = failing or set()

    async def ensure(self, key: QueueKey, attrs: dict[str, Any]) -> bool:
        self.calls.append(("ensure", key))
        return key not in self.failing

    async def drop(self, key: QueueKey) -> bool:
        self.calls.append(("drop", key))
        return key not in self.failing


async def opened(records: QueueRecords, store: Store) -> PoolQueues:
    """Pool partition 1's term begun on ``records``, its first pass done."""
    queues = PoolQueues()
    queues.begin_term(records, 1)
    await queues.apply(records, 1, store.ensure, store.drop)
    return queues


class Watch:
    """``queues/`` as a watch delivers it: a state, and the keys that changed."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self.revision = 0

    def write(self, records: QueueRecords, **docs: dict[str, Any] | None) -> dict[int, set[QueueKey]]:
        keys: set[str] = set()
        for name, value in docs.items():
            self.revision += 1
            key = f"{PREFIX}t/{name}"
            keys.add(key)
            if value is None:
                self.entries.pop(key, None)
            else:
                self.entries[key] = Entry(key, pack(value), self.revision, self.revision)
        return records.follow(PrefixState(PREFIX, self.revision, dict(self.entries)), keys)


def test_a_queue_is_served_where_its_placement_says_and_nowhere_else() -> None:
    records, watch = QueueRecords(), Watch()
    changed = watch.write(records, a=doc(1, 2), b=doc(2), old=doc())
    assert changed == {1: {("t", "a")}, 2: {("t", "a"), ("t", "b")}}  # "old": its own partitions
    assert records.want(1, ("t", "a")) == Want.ENSURE and records.want(3, ("t", "a")) == Want.KEEP
    assert records.on_partition(2) == {("t", "a"), ("t", "b")} and records.on_partition(3) == set()
    assert records[("t", "old")]["replication_factor"] == 3  # every record, for the partitions of old queues


def test_a_queue_is_deleted_on_its_deleting_mark_never_on_its_records_absence() -> None:
    records, watch = QueueRecords(), Watch()
    watch.write(records, a=doc(1), b=doc(1))
    assert watch.write(records, a=doc(1, deleting=True)) == {1: {("t", "a")}}
    assert records.want(1, ("t", "a")) == Want.DROP and records.want(2, ("t", "a")) == Want.KEEP
    # Gone from etcd (deleted, or an etcd restored from an older backup): kept as it is.
    assert watch.write(records, b=None) == {1: {("t", "b")}}
    assert records.want(1, ("t", "b")) == Want.KEEP


def test_dead_letter_copies_live_in_the_partitions_of_the_queues_feeding_them() -> None:
    records, watch = QueueRecords(), Watch()
    watch.write(records, dlq=doc(5), a=doc(1, 2, dead_letter_queue="dlq"))
    assert records.on_partition(1) == {("t", "a"), ("t", "dlq")}
    assert records.want(1, ("t", "dlq")) == Want.ENSURE and records.want(5, ("t", "dlq")) == Want.ENSURE
    # A change to the dead-letter queue's record reaches its copies too.
    assert watch.write(records, dlq=doc(5, maximum_message_size=1024)) == {
        5: {("t", "dlq")},
        1: {("t", "dlq")},
        2: {("t", "dlq")},
    }
    # A former dead-letter queue's copy keeps what moved there: neither made nor deleted.
    former = doc(1, 2, former_dead_letter_queues=[["dlq", 7]])
    watch.write(records, a=former)
    assert records.want(1, ("t", "dlq")) == Want.KEEP and ("t", "dlq") in records.on_partition(1)
    # Deleting the dead-letter queue deletes its copies, wherever they are.
    watch.write(records, dlq=doc(5, deleting=True))
    assert {pid: records.want(pid, ("t", "dlq")) for pid in (1, 2, 5, 6)} == {
        1: Want.DROP,
        2: Want.DROP,
        5: Want.DROP,
        6: Want.KEEP,
    }


async def test_a_term_applies_its_queues_once_then_only_what_changed() -> None:
    records, watch, store = QueueRecords(), Watch(), Store()
    watch.write(records, **{f"q{i}": doc(i % 4) for i in range(400)})
    queues = PoolQueues()
    queues.begin_term(records, 1)
    assert queues.not_ready("send", {"tenant": "t", "queue": "q1"}) == "q1 not applied yet"
    # A request naming many is refused naming a few (it may name a partition's every queue).
    many = {"tenant": "t", "names": [f"q{i}" for i in range(0, 400, 4)]}
    assert queues.not_ready("queue_stats", many) == "q0, q100, q104, q108, q112 and 95 more not applied yet"
    await queues.apply(records, 1, store.ensure, store.drop)
    assert len(store.calls) == 100 and {op for op, _ in store.calls} == {"ensure"}
    assert queues.not_ready("send", {"tenant": "t", "queue": "q1"}) is None
    assert queues.not_ready("send", {"tenant": "t", "queue": "q2"}) == "q2 not applied yet"  # not ours
    # One new queue: one store call, not a pass over the partition's hundred.
    store.calls.clear()
    for pid, keys in watch.write(records, new=doc(1)).items():
        assert pid == 1
        queues.changed(keys)
    await queues.apply(records, 1, store.ensure, store.drop)
    assert store.calls == [("ensure", ("t", "new"))]
    # The same attributes again (a record rewritten as it was): nothing to write.
    store.calls.clear()
    queues.changed(watch.write(records, new=doc(1))[1])
    await queues.apply(records, 1, store.ensure, store.drop)
    assert store.calls == []


async def test_a_queue_marked_deleting_is_dropped_and_answers_not_leader_but_to_its_delete() -> None:
    records, watch, store = QueueRecords(), Watch(), Store()
    watch.write(records, a=doc(1))
    queues = await opened(records, store)
    queues.changed(watch.write(records, a=doc(1, deleting=True))[1])
    await queues.apply(records, 1, store.ensure, store.drop)
    assert store.calls[-1] == ("drop", ("t", "a"))
    assert queues.not_ready("send", {"tenant": "t", "queue": "a"}) == "a not applied yet"
    assert queues.not_ready("delete_queue", {"tenant": "t", "name": "a"}) is None
    # Its record gone: nothing more is done, and a new term does not make it again.
    store.calls.clear()
    watch.write(records, a=None)
    queues.begin_term(records, 1)
    await queues.apply(records, 1, store.ensure, store.drop)
    assert store.calls == []


async def test_a_dead_letter_copy_is_made_before_the_queue_feeding_it_and_failures_are_retried() -> None:
    records, watch = QueueRecords(), Watch()
    watch.write(records, a=doc(1, dead_letter_queue="z-dlq"), **{"z-dlq": doc(9)})
    store = Store(failing={("t", "z-dlq")})
    queues = await opened(records, store)
    # The copy first (the queue's link to it needs it); it failed, so the queue waits for
    # it: both stay pending, tried again at the next tick.
    assert store.calls == [("ensure", ("t", "z-dlq"))]
    assert queues.pending == {("t", "a"), ("t", "z-dlq")} and queues.applied == {}
    store.failing.clear()
    await queues.apply(records, 1, store.ensure, store.drop)
    assert set(queues.applied) == {("t", "a"), ("t", "z-dlq")} and queues.pending == set()


@pytest.mark.parametrize("names", [["a", "b"], ["a", "missing"]])
def test_a_stats_request_is_ready_when_every_queue_it_names_is(names: list[str]) -> None:
    queues = PoolQueues(applied={("t", "a"): {}, ("t", "b"): None}, opened=True)
    why = queues.not_ready("queue_stats", {"tenant": "t", "names": names})
    assert (why is None) == ("missing" not in names)


async def test_a_queue_a_gateway_deleted_is_made_again_from_its_live_record() -> None:
    # The watch showed the deleting mark, the record's removal and the record made again as
    # one change: the queue is still counted applied with the same attributes. The deleting
    # gateway's delete_queue took it out of the store: the next pass makes it again.
    records, watch, store = QueueRecords(), Watch(), Store()
    watch.write(records, a=doc(1))
    queues = await opened(records, store)
    queues.served("delete_queue", {"tenant": "t", "name": "a"})
    assert queues.not_ready("send", {"tenant": "t", "queue": "a"}) == "a not applied yet"
    store.calls.clear()
    queues.changed(watch.write(records, a=doc(1))[1])
    await queues.apply(records, 1, store.ensure, store.drop)
    assert (
        store.calls == [("ensure", ("t", "a"))]
        and queues.not_ready("send", {"tenant": "t", "queue": "a"}) is None
    )


def test_a_record_whose_placement_cannot_be_read_is_placed_nowhere_and_fails_nothing() -> None:
    records, watch = QueueRecords(), Watch()
    changed = watch.write(records, bad={pools.PLACEMENT: ["x", None]}, good=doc(1))
    assert changed == {1: {("t", "good")}}
    assert records.on_partition(1) == {("t", "good")} and pools.placement(records[("t", "bad")]) == ()


async def test_a_new_queue_is_made_by_its_first_request_not_at_the_next_pass() -> None:
    # A create's first request reaches the leader about when its watch brings the record:
    # the queue is made then (no not_leader for the gateway to back off and retry on), and
    # each request makes only its own queue (concurrent ones share a group commit).
    records, watch, store = QueueRecords(), Watch(), Store()
    watch.write(records, a=doc(1))
    queues = await opened(records, store)
    store.calls.clear()
    watch.write(records, new=doc(1), other=doc(1), elsewhere=doc(2))  # the term's task has not run
    create = {"tenant": "t", "name": "new", "attributes": {}}
    assert await ready_or_applied(SLOT_1, (), queues, 1, "create_queue", create, store.ensure) is None
    assert store.calls == [("ensure", ("t", "new"))]
    assert queues.not_ready("send", {"tenant": "t", "queue": "other"}) == "other not applied yet"
    # Not this partition's queue, or no record yet: not_leader as before, nothing made.
    for name in ("elsewhere", "unknown"):
        why = await ready_or_applied(
            SLOT_1, (), queues, 1, "send", {"tenant": "t", "queue": name}, store.ensure
        )
        assert why == f"{name} not applied yet"
    assert store.calls == [("ensure", ("t", "new"))]


async def test_a_request_makes_no_queue_before_the_terms_first_pass_nor_one_whose_copy_is_missing() -> None:
    records, watch, store = QueueRecords(), Watch(), Store()
    watch.write(records, dlq=doc(5), a=doc(1, dead_letter_queue="dlq"), b=doc(1), gone=doc(1, deleting=True))
    queues = PoolQueues()
    queues.begin_term(records, 1)
    send_b = {"tenant": "t", "queue": "b"}
    assert await ready_or_applied(SLOT_1, (), queues, 1, "send", send_b, store.ensure) == "b not applied yet"
    assert store.calls == []  # the term's first entry and pass come first
    queues.opened, queues.pending = True, set()
    send_a = {"tenant": "t", "queue": "a"}
    assert await ready_or_applied(SLOT_1, (), queues, 1, "send", send_a, store.ensure) == "a not applied yet"
    send_gone = {"tenant": "t", "queue": "gone"}
    assert (
        await ready_or_applied(SLOT_1, (), queues, 1, "send", send_gone, store.ensure)
        == "gone not applied yet"
    )
    assert store.calls == []  # a's copy of dlq is the pass's to make first; gone is being deleted
    assert await ready_or_applied(SLOT_1, (), queues, 1, "send", send_b, store.ensure) is None


async def test_a_record_that_changed_while_its_queue_was_made_is_applied_again_by_the_pass() -> None:
    records, watch = QueueRecords(), Watch()
    watch.write(records, q=doc(1))
    queues = PoolQueues(opened=True, records=records)

    async def ensure_while_marked(key: QueueKey, attrs: dict[str, Any]) -> bool:
        watch.write(records, q=doc(1, deleting=True))  # the deletion's mark lands meanwhile
        return True

    why = await ready_or_applied(
        SLOT_1, (), queues, 1, "send", {"tenant": "t", "queue": "q"}, ensure_while_marked
    )
    assert why == "q not applied yet" and queues.pending == {("t", "q")}
    store = Store()
    await queues.apply(records, 1, store.ensure, store.drop)
    assert store.calls == [("drop", ("t", "q"))]


async def test_a_queue_made_by_a_request_while_a_new_term_began_is_left_to_that_terms_pass() -> None:
    records, watch = QueueRecords(), Watch()
    watch.write(records, q=doc(1))
    queues = PoolQueues(opened=True, records=records)

    async def ensure_across_terms(key: QueueKey, attrs: dict[str, Any]) -> bool:
        queues.begin_term(records, 1)  # deposed and elected again meanwhile
        return True

    send = {"tenant": "t", "queue": "q"}
    assert (
        await ready_or_applied(SLOT_1, (), queues, 1, "send", send, ensure_across_terms)
        == "q not applied yet"
    )
    assert queues.applied == {} and queues.pending == {("t", "q")}


async def test_a_terms_first_pass_gives_the_event_loop_back_every_few_hundred_queues() -> None:
    """A pass over a partition's queues (1,250 at 10,000 queues on 8 partitions) must not
    hold the node's loop, and its lease renewals and heartbeats with it, in one turn (issue
    48, item 3), nor yield so often that a busy loop's turns make the pass last (session
    58: every 100 queues, three terms begun at once took 0.32-0.40 s): with a store that
    never waits, 2,500 queues are applied in five turns of the loop, 500 each."""
    records, watch, store = QueueRecords(), Watch(), Store()
    watch.write(records, **{f"q{i}": doc(1) for i in range(2500)})
    queues = PoolQueues()
    queues.begin_term(records, 1)
    turn = 0

    async def count_turns() -> None:
        nonlocal turn
        while True:
            turn += 1
            await asyncio.sleep(0)

    turns: list[int] = []  # the loop's turn each queue was applied in

    async def ensure(key: QueueKey, attrs: dict[str, Any]) -> bool:
        turns.append(turn)
        return await store.ensure(key, attrs)

    counting = asyncio.create_task(count_turns())
    try:
        await queues.apply(records, 1, ensure, store.drop)
    finally:
        counting.cancel()
    assert sorted(Counter(turns).values()) == [500] * 5
    assert len(store.calls) == 2500 and queues.opened


async def test_a_pass_applies_its_queues_together_so_their_writes_share_group_commits() -> None:
    # A create is a record write; the leader's pass makes the new queues. One write at a
    # time, each its own replicated commit, cost the nodes twice a create's CPU (issue 49,
    # session 73): the pass's writes are in flight together. A dead-letter queue's copy still
    # comes first, before the queue feeding it asks for it.
    records, watch, store = QueueRecords(), Watch(), Store()
    watch.write(
        records, a=doc(1, dead_letter_queue="dlq"), **{f"q{i}": doc(1) for i in range(20)}, dlq=doc(9)
    )
    queues = PoolQueues()
    queues.begin_term(records, 1)
    release, all_in = asyncio.Event(), asyncio.Event()
    in_flight: list[QueueKey] = []

    async def ensure(key: QueueKey, attrs: dict[str, Any]) -> bool:
        in_flight.append(key)
        if len(in_flight) == 21:
            all_in.set()
        if key != ("t", "dlq"):
            await release.wait()
        in_flight.remove(key)
        return await store.ensure(key, attrs)

    applying = asyncio.create_task(queues.apply(records, 1, ensure, store.drop))
    await asyncio.wait_for(all_in.wait(), 5)
    assert store.calls == [("ensure", ("t", "dlq"))]  # the copy first, alone
    assert len(in_flight) == 21  # then a and q0..q19, all at once
    release.set()
    await applying
    assert len(store.calls) == 22 and queues.opened and not queues.pending


async def test_a_create_asking_for_its_records_attributes_makes_the_queue_with_its_own_write() -> None:
    # The creating gateway's create_queue: its own write makes the queue, and the queue is
    # applied after it (no read, no write of the pass's own, no empty write of the request).
    records, watch, store = QueueRecords(), Watch(), Store()
    watch.write(records, a=doc(1))
    queues = await opened(records, store)
    changed = watch.write(
        records, new=doc(1, retention_s=60), dlq=doc(1), fed=doc(1, dead_letter_queue="dlq")
    )
    queues.changed(changed[1])
    attributes = store_attributes(records[("t", "new")])
    claim = queues.claim_create(1, {"tenant": "t", "name": "new", "attributes": attributes})
    assert claim is not None and ("t", "new") not in queues.applied
    queues.created(claim)
    assert queues.applied[("t", "new")] == attributes and ("t", "new") not in queues.pending
    store.calls.clear()
    await queues.apply(records, 1, store.ensure, store.drop)
    assert ("ensure", ("t", "new")) not in store.calls  # the pass finds it applied
    # Not claimed: other attributes than its record's (the store must say QueueExists or
    # the record wins), a queue whose dead-letter copy comes first, one applied already,
    # one this partition does not serve, and any before the term's first pass.
    watch.write(records, other=doc(1), elsewhere=doc(2), fed2=doc(1, dead_letter_queue="dlq"))
    for name, attrs in [
        ("other", {"retention_s": 5}),
        ("fed2", store_attributes(records[("t", "fed2")])),
        ("new", attributes),
        ("elsewhere", store_attributes(records[("t", "elsewhere")])),
    ]:
        assert queues.claim_create(1, {"tenant": "t", "name": name, "attributes": attrs}) is None
    queues.begin_term(records, 1)
    other = {"tenant": "t", "name": "other", "attributes": store_attributes(records[("t", "other")])}
    assert queues.claim_create(1, other) is None


@pytest.mark.parametrize("meanwhile", ["record changed", "new term"])
async def test_a_claimed_create_is_not_counted_applied_when_its_record_or_term_changed(
    meanwhile: str,
) -> None:
    records, watch = QueueRecords(), Watch()
    watch.write(records, q=doc(1))
    queues = PoolQueues(opened=True, records=records)
    claim = queues.claim_create(
        1, {"tenant": "t", "name": "q", "attributes": store_attributes(records[("t", "q")])}
    )
    assert claim is not None
    if meanwhile == "record changed":
        queues.changed(watch.write(records, q=doc(1, deleting=True))[1])
    else:
        queues.begin_term(records, 1)
    queues.created(claim)
    assert ("t", "q") not in queues.applied and ("t", "q") in queues.pending  # the pass's to apply


@pytest.mark.parametrize("names", [["a", "b"], ["a", "missing"]])
def test_a_send_to_several_queues_is_ready_when_every_queue_it_sends_to_is(names: list[str]) -> None:
    queues = PoolQueues(applied={("t", "a"): {}, ("t", "b"): None}, opened=True)
    why = queues.not_ready("send_queues", {"tenant": "t", "sends": [[n, []] for n in names]})
    assert (why is None) == ("missing" not in names)


async def test_a_first_pass_serves_what_the_store_holds_as_wanted_without_ensuring_it() -> None:
    # A new leader's first pass goes over every queue of its partition, and nearly all are
    # held as their records say: those are served at once (no ensure, no task), a few
    # thousand a turn of the loop; the rest are ensured as before, a dead-letter queue
    # before the queue that feeds it (a failover's last queue waits for the whole pass).
    records = QueueRecords.of(
        {
            **{("t", f"q{i:04d}"): doc(1) for i in range(5000)},
            ("t", "changed"): doc(1, visibility_timeout_s=9),
            ("t", "feeds"): doc(1, dead_letter_queue="dlq"),
            ("t", "dlq"): doc(1),
            ("t", "elsewhere"): doc(2),
        }
    )
    wanted = store_attributes(doc(1))
    held = {key for key in records if key[1].startswith("q") or key[1] in ("feeds", "dlq")}
    store = Store()
    queues = PoolQueues()
    queues.begin_term(records, 1)
    turns = 0
    loop = asyncio.get_running_loop()
    stop = loop.create_future()

    def count() -> None:
        nonlocal turns
        turns += 1
        if not stop.done():
            loop.call_soon(count)

    loop.call_soon(count)
    await queues.apply(
        records, 1, store.ensure, store.drop, lambda key, attrs: key in held and attrs == wanted
    )
    stop.set_result(None)
    assert queues.opened
    assert set(queues.applied) == set(records) - {("t", "elsewhere")}
    # Only what the store does not hold as wanted, and the dead-letter pair in its order.
    assert store.calls == [("ensure", ("t", "dlq")), ("ensure", ("t", "changed")), ("ensure", ("t", "feeds"))]
    # 5,003 queues settled a few thousand a turn: the pass yielded, but not 500 at a time.
    assert 2 <= turns <= 6, turns
