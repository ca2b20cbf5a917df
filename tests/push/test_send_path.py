"""One send path for every transport (push/send_path.py): a send over HTTP, a WebSocket
``send`` frame and a WebSocket batch frame meet the same rules (the stored-messages quota,
the shared dedupe front, usage), through a real gateway and real clients."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from backend_store import NewMessage, QueueName, TenantId, open_backend
from backend_store.backend import Backend
from backend_store.errors import InvalidRequest, PushgateError, QueueNotFound, QuotaExceeded
from backend_store.types import SendResult
from push.observer import HTTP, OK, SEND, WS, Observers
from push.send_group import SendGroup
from push.send_path import Allowance, SendItem, SendPath, SendResults
from tests.conftest import scaled, wait_for
from tests.gateway.conftest import RunningGateway

from .conftest import Http, request, ws_connect
from .test_send_groups import Recorded


@pytest.fixture
async def tenant_http(gateway: RunningGateway) -> Any:
    """An admin client of a fresh tenant (limits set here never leak into other tests)."""
    tenant = gateway.make_tenant()
    key = gateway.make_key("admin", tenant)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=scaled(30)) as client:
        yield key, Http(client)


async def test_the_stored_messages_quota_refuses_sends_on_every_transport(
    gateway: RunningGateway, tenant_http: tuple[str, Http], qname: str
) -> None:
    key, http = tenant_http
    await http.queue(qname)
    limits = await http.client.put("/v1/limits", json={"max_stored_messages": 30})
    assert limits.status_code == 200, limits.text
    await http.send_many(qname, [f"h{i}" for i in range(20)])
    for i in range(10):
        await http.send(qname, f"s{i}")
    over = await http.client.post(f"/v1/queues/{qname}/messages", json={"body": "31st"})
    assert over.status_code == 409 and over.json()["code"] == "quota_exceeded"

    async with ws_connect(gateway, key) as ws:
        for i in range(20):
            reply = await request(ws, op="send", queue=qname, body=f"w{i}", id=i)
            assert reply["op"] == "error" and reply["code"] == "quota_exceeded", reply
        for i in range(2):
            batch = [{"body": f"b{i}-{j}"} for j in range(10)]
            reply = await request(ws, op="send", queue=qname, messages=batch, id=100 + i)
            assert reply["op"] == "error" and reply["code"] == "quota_exceeded", reply
    stats = await http.stats(qname)
    assert stats["visible"] == 30


async def test_a_websocket_retry_is_answered_by_the_shared_dedupe_front(
    gateway: RunningGateway, http: Http, qname: str
) -> None:
    """A send retried with its ``dedupe_id`` over a WebSocket, single or in a batch frame, is
    answered from the dedupe front (no store commit), as an HTTP retry is."""
    await http.queue(qname)

    async def hits() -> float:
        text = (await http.client.get("/metrics")).text
        match = re.search(r"^pushgate_dedupe_front_hits_total (\S+)$", text, re.M)
        return 0.0 if match is None else float(match[1])

    first = await http.send(qname, "one", dedupe_id="d1")
    before = await hits()
    async with ws_connect(gateway, gateway.admin_key) as ws:
        again = await request(ws, op="send", queue=qname, body="one", dedupe_id="d1", id=1)
        assert again["op"] == "ok", again
        assert again["result"] == {"id": first["id"], "seq": first["seq"], "duplicate": True}
        batch = await request(
            ws, op="send", queue=qname, messages=[{"body": "one", "dedupe_id": "d1"}, {"body": "two"}], id=2
        )
        assert batch["op"] == "ok", batch
        assert batch["results"][0] == {"id": first["id"], "seq": first["seq"], "duplicate": True}
        assert batch["results"][1]["duplicate"] is False
    assert await hits() == before + 2
    assert (await http.stats(qname))["visible"] == 2


# The path itself, on a real store -----------------------------------------------------

T = TenantId("t")
Q = QueueName("q")


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[Backend]:
    store = open_backend(f"lmdb://{tmp_path}")
    await store.start()
    await store.create_queue(T, Q, {})
    try:
        yield store
    finally:
        await store.close()


class GatedStore:
    """The store's send behind a gate the test opens; each call's size is kept."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.calls: list[int] = []
        self.gate = asyncio.Event()

    async def send(self, tenant: TenantId, queue: QueueName, entries: Sequence[NewMessage]) -> SendResults:
        self.calls.append(len(entries))
        await self.gate.wait()
        return await self.backend.send(tenant, queue, entries)


class FixedQuota:
    """A quota with a known count (the gateway's Enforcer counts the store)."""

    def __init__(self, stored: int, limit: int) -> None:
        self.count = stored
        self.limit = limit

    async def allowance(self, tenant: TenantId) -> Allowance | None:
        return Allowance(self.count, self.limit)

    def stored(self, tenant: TenantId, added: int) -> None:
        self.count += added


def bodies(*texts: str) -> list[NewMessage | PushgateError]:
    return [NewMessage(t.encode()) for t in texts]


async def test_sends_that_come_during_a_store_call_go_together_in_the_next(backend: Backend) -> None:
    """An HTTP-style caller (awaiting) on an idle queue makes the call itself; what comes
    meanwhile, awaited or answered by callback (a WebSocket frame, a group of single
    sends), goes in one next call, each answered with its own results in order."""
    store = GatedStore(backend)
    recorded = Recorded()
    path = SendPath(store.send, backend.get_queue, Observers([recorded]))
    first = asyncio.ensure_future(path.send(T, Q, bodies("a"), HTTP))

    async def first_call() -> bool:
        return store.calls == [1]

    await wait_for(first_call)
    later = [asyncio.ensure_future(path.send(T, Q, bodies(f"h{i}", f"i{i}"), HTTP)) for i in range(3)]
    await asyncio.sleep(0)  # the awaiting callers queue their items
    frame: asyncio.Future[SendResults | PushgateError] = asyncio.get_running_loop().create_future()
    path.submit(T, Q, SendItem(bodies("w"), frame.set_result, WS, time.perf_counter()))
    grouped: asyncio.Future[SendResults | PushgateError] = asyncio.get_running_loop().create_future()
    group = SendGroup(Q, NewMessage(b"g0"), 0, time.perf_counter(), grouped.set_result)
    path.submit(T, Q, group)
    group.add(NewMessage(b"g1"), 1, time.perf_counter())
    assert store.calls == [1]  # nothing else is sent while the first call is under way
    store.gate.set()
    async with asyncio.timeout(scaled(10)):
        answers = [await first, *[await f for f in later], await frame, await grouped]
    assert store.calls == [1, 3 * 2 + 1 + 2]
    seqs: list[int] = []
    for answer in answers:
        assert not isinstance(answer, PushgateError)
        assert all(isinstance(r, SendResult) and not r.duplicate for r in answer)
        seqs.extend(r.seq for r in answer if isinstance(r, SendResult))
    assert seqs == sorted(seqs) and len(set(seqs)) == 10
    assert recorded.units == {(Q, SEND, OK): 10}
    await path.wait_idle()


async def test_the_quota_refuses_whole_requests_and_single_sends_one_by_one(backend: Backend) -> None:
    store = GatedStore(backend)
    store.gate.set()
    recorded = Recorded()
    quota = FixedQuota(stored=2, limit=5)
    path = SendPath(store.send, backend.get_queue, Observers([recorded]), quota=quota)
    answers: list[asyncio.Future[SendResults | PushgateError]] = [
        asyncio.get_running_loop().create_future() for _ in range(3)
    ]
    path.submit(T, Q, SendItem(bodies("a", "b"), answers[0].set_result, HTTP, time.perf_counter()))
    path.submit(T, Q, SendItem(bodies("c", "d"), answers[1].set_result, WS, time.perf_counter()))
    group = SendGroup(Q, NewMessage(b"e"), 0, time.perf_counter(), answers[2].set_result)
    path.submit(T, Q, group)
    group.add(NewMessage(b"f"), 1, time.perf_counter())
    group.add(NewMessage(b"g"), 2, time.perf_counter())
    async with asyncio.timeout(scaled(10)):
        batch_ok, batch_refused, singles = [await a for a in answers]
    assert not isinstance(batch_ok, PushgateError) and len(batch_ok) == 2  # 2 + 2 = 4 <= 5
    assert isinstance(batch_refused, QuotaExceeded)  # 4 + 2 > 5: the whole request
    assert not isinstance(singles, PushgateError)
    e, f, g = singles
    assert isinstance(e, SendResult) and isinstance(f, QuotaExceeded) and isinstance(g, QuotaExceeded)
    assert store.calls == [3] and quota.count == 5
    assert recorded.units == {
        (Q, SEND, OK): 3,
        (Q, SEND, "quota_exceeded"): 1 + 2,  # one per request refused
    }
    # An awaiting caller hears the refusal raised.
    with pytest.raises(QuotaExceeded):
        await path.send(T, Q, bodies("h"), HTTP)


async def test_a_call_that_fails_answers_every_request_once(backend: Backend) -> None:
    recorded = Recorded()
    path = SendPath(backend.send, backend.get_queue, Observers([recorded]))
    missing = QueueName("missing")
    with pytest.raises(QueueNotFound):
        await path.send(T, missing, bodies("a", "b"), HTTP)
    # Every entry invalid: nothing to store, and the queue must still exist.
    with pytest.raises(QueueNotFound):
        await path.send(T, missing, [InvalidRequest("bad")], HTTP)
    # On a queue that exists, each bad entry is its own answer.
    (only,) = await path.send(T, Q, [InvalidRequest("bad")], HTTP)
    assert isinstance(only, InvalidRequest)
    assert recorded.units == {(missing, SEND, "queue_not_found"): 2, (Q, SEND, "invalid_request"): 1}
