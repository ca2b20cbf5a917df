"""The one send path: every send reaches the store here, whichever transport brought it.

An HTTP ``POST .../messages`` (one message or a batch), a WebSocket ``send`` frame (single
or batch) and the SQS API's ``SendMessage`` / ``SendMessageBatch`` hand their entries to
one :class:`SendPath`. What a send meets on its way, in this order, is applied here once
per queue's store call, never by a transport:

1. **batching**: sends to a queue that arrive while its previous store call is under way
   go together in the next one (:class:`~push.batching.KeyedBatcher`, one call in flight
   per queue); a connection's consecutive single-message WebSocket sends ride as one item
   (:mod:`push.send_group`);
2. **the stored-messages quota** (``max_stored_messages``, injected as a
   :class:`StoredQuota`): a request that would pass it is refused as a whole with
   ``quota_exceeded``, the requests before it in the call still go (a group's single sends
   are a request each);
3. **the dedupe front and the store** (the injected :data:`StoreSend`: the gateway's
   shared cache of recent ``dedupe_id`` results in front of ``Backend.send``), in chunks of
   at most :data:`MAX_MESSAGES_PER_CALL`;
4. **usage and metrics**: each request's outcome goes to the observe point once
   (``push/observed.py``), stored messages with the request's latency;
5. **the reply**: each request hears its own results, in its entries' order.

What stays at the transport's edge, because each transport answers it its own way, is
what a request meets before its entries exist: authentication and scopes, the rate limits
(one per request, through the gateway's ``Enforcer``: a 429 with its fields over HTTP, a
refusal frame over WebSocket) and parsing, where every transport checks a message with
:func:`push.messages.parse_message` or the SQS API's own limits; a bad batch entry becomes
its error and rides along so its place in the answer is kept.

Cost: nothing here is per message but a list append and the store's own work; a request
costs an item (a few slots), and a store call one task at most: a request-and-response
caller (:meth:`SendPath.send`) that finds its queue idle runs the call in its own coroutine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, cast

from backend_store.errors import PushgateError, QuotaExceeded
from backend_store.types import NewMessage, QueueInfo, QueueName, SendResult, TenantId

from .batching import KeyedBatcher
from .observed import error_code, record_sends
from .observer import SEND, Observer

logger = logging.getLogger("pushgate.push")

# How many messages one store call takes (a batcher call with more makes several).
MAX_MESSAGES_PER_CALL = 500

SendResults = list[SendResult | PushgateError]
# What a request hears back: one result per entry, or the refusal of the whole request.
SendReply = Callable[[SendResults | PushgateError], None]
# The store's send as the path calls it: ``Backend.send``, or the gateway's dedupe front in front of it.
StoreSend = Callable[[TenantId, QueueName, Sequence[NewMessage]], Awaitable[SendResults]]
# Whether a queue exists (raises ``QueueNotFound``): asked only when no entry of a call is valid.
CheckQueue = Callable[[TenantId, QueueName], Awaitable[QueueInfo]]


class Allowance:
    """How many more messages a tenant may store, for one store call's requests."""

    __slots__ = ("limit", "stored")

    def __init__(self, stored: int, limit: int) -> None:
        self.stored = stored
        self.limit = limit

    def take(self, adding: int) -> QuotaExceeded | None:
        """Count ``adding`` messages in, or return the refusal (and count nothing)."""
        if self.stored + adding > self.limit:
            return QuotaExceeded(
                f"the tenant stores {self.stored} messages; {adding} more would pass its quota "
                f"(max_stored_messages is {self.limit})"
            )
        self.stored += adding
        return None


class StoredQuota(Protocol):
    """The stored-messages quota (the gateway's ``Enforcer`` is one)."""

    async def allowance(self, tenant: TenantId) -> Allowance | None:
        """What the tenant may still store (None: it has no quota)."""

    def stored(self, tenant: TenantId, added: int) -> None:
        """``added`` messages were stored (not duplicates): keep a cached count current."""


class SendItem:
    """One request's share of a store call: its entries (a bad one is its error), its
    transport, when it started (``time.perf_counter()``: its usage latency ends at its
    answer) and who hears the answer.

    Open until the path takes it into a store call (:attr:`taken`): until then a
    :class:`~push.send_group.SendGroup` may take more entries.
    """

    __slots__ = ("entries", "refused", "reply", "started", "taken", "transport", "valid")

    def __init__(
        self,
        entries: list[NewMessage | PushgateError],
        reply: SendReply,
        transport: str,
        started: float,
        valid: bool | None = None,
    ) -> None:
        self.entries = entries
        self.reply = reply
        self.transport = transport
        self.started = started
        self.taken = False
        # Every entry is a NewMessage (none was refused by parsing): its results are one slice.
        self.valid = all(isinstance(e, NewMessage) for e in entries) if valid is None else valid
        # The refusal of the whole request (the quota), when it gets one.
        self.refused: PushgateError | None = None

    @property
    def requests(self) -> int:
        """How many requests the item answers (usage counts a failure once per request)."""
        return 1

    def take_quota(self, allowance: Allowance) -> None:
        """All of the request's valid entries fit, or the request is refused."""
        adding = len(self.entries) if self.valid else sum(isinstance(e, NewMessage) for e in self.entries)
        if adding:
            self.refused = allowance.take(adding)

    def record(self, observer: Observer, tenant: TenantId, queue: QueueName, results: SendResults) -> int:
        """Report the outcome (usage, metrics); return how many messages were stored."""
        latency = time.perf_counter() - self.started
        return record_sends(observer, tenant, queue, self.transport, self.entries, results, latency)


class SendPath(KeyedBatcher[tuple[TenantId, QueueName], SendItem]):
    """Sends per queue, with every rule of the module docstring; see :meth:`send` (a caller
    that awaits its answer) and :meth:`submit` (one answered through a callback)."""

    def __init__(
        self,
        store_send: StoreSend,
        check_queue: CheckQueue,
        observer: Observer,
        quota: StoredQuota | None = None,
    ) -> None:
        super().__init__()
        self._store_send = store_send
        self._check_queue = check_queue
        self._observer = observer
        self._quota = quota

    async def send(
        self,
        tenant: TenantId,
        queue: QueueName,
        entries: list[NewMessage | PushgateError],
        transport: str,
        started: float | None = None,
    ) -> SendResults:
        """Send one request's entries: one result per entry, in order (a result is a
        :class:`SendResult` or the entry's own error, as a batch answers). A refusal of the
        whole request (``quota_exceeded``, ``queue_not_found``, ``unavailable``) is raised;
        it has been recorded (usage, metrics) already, so the caller only answers it.

        ``started``: when the request began (``time.perf_counter()``), for its latency."""
        answer = _Answer()
        item = SendItem(entries, answer, transport, time.perf_counter() if started is None else started)
        if not await self.add_inline((tenant, queue), item):
            await answer.wait()
        result = answer.result
        if isinstance(result, PushgateError):
            raise result
        assert result is not None
        return result

    def submit(self, tenant: TenantId, queue: QueueName, item: SendItem) -> None:
        """Queue a request answered through ``item.reply`` (a group may grow until :attr:`SendItem.taken`)."""
        self.add((tenant, queue), item)

    async def flush(self, key: tuple[TenantId, QueueName], items: list[SendItem]) -> None:
        tenant, queue = key
        try:
            admitted = await self._admit(tenant, items)
            results = await self._store(tenant, queue, admitted)
        except Exception as exc:
            error = exc if isinstance(exc, PushgateError) else _internal(exc)
            for item in items:
                self._refuse(tenant, queue, item, item.refused or error)
            return
        self._answer(tenant, queue, items, results)

    async def _admit(self, tenant: TenantId, items: list[SendItem]) -> list[NewMessage]:
        """Close the items, apply the quota, and return the entries that go to the store."""
        allowance = None if self._quota is None else await self._quota.allowance(tenant)
        admitted: list[NewMessage] = []
        for item in items:
            item.taken = True  # nothing joins it from here on: its entries are in this call
            if allowance is not None:
                item.take_quota(allowance)
                if item.refused is not None:
                    continue
            if item.valid:
                admitted.extend(cast(list[NewMessage], item.entries))
            else:
                admitted.extend(e for e in item.entries if isinstance(e, NewMessage))
        return admitted

    async def _store(self, tenant: TenantId, queue: QueueName, entries: list[NewMessage]) -> SendResults:
        if not entries:
            # Nothing to store (every entry invalid or refused): the answer still needs the queue.
            await self._check_queue(tenant, queue)
            return []
        if len(entries) <= MAX_MESSAGES_PER_CALL:
            return await self._store_send(tenant, queue, entries)
        results: SendResults = []
        for start in range(0, len(entries), MAX_MESSAGES_PER_CALL):
            results.extend(
                await self._store_send(tenant, queue, entries[start : start + MAX_MESSAGES_PER_CALL])
            )
        return results

    def _answer(
        self, tenant: TenantId, queue: QueueName, items: list[SendItem], results: SendResults
    ) -> None:
        observer = self._observer
        position = stored = 0
        for item in items:
            if item.refused is not None:
                self._refuse(tenant, queue, item, item.refused)
                continue
            entries = item.entries
            if item.valid:
                # Every entry went to the store: its results are one slice.
                end = position + len(entries)
                mine = results[position:end]
                position = end
            else:
                mine = []
                for entry in entries:
                    if isinstance(entry, NewMessage):
                        mine.append(results[position])
                        position += 1
                    else:
                        mine.append(entry)
            stored += item.record(observer, tenant, queue, mine)
            item.reply(mine)
        if stored and self._quota is not None:
            self._quota.stored(tenant, stored)

    def _refuse(self, tenant: TenantId, queue: QueueName, item: SendItem, error: PushgateError) -> None:
        self._observer.observe(tenant, queue, SEND, item.transport, error_code(error), item.requests)
        item.reply(error)


def _internal(exc: Exception) -> PushgateError:
    # A bug, not a store error: logged here once; the client sees a bare internal error.
    logger.error("send failed", exc_info=exc)
    return PushgateError("an unexpected error occurred")


class _Answer:
    """The reply of a request whose caller awaits it (:meth:`SendPath.send`): a future only
    when the answer did not come while the caller ran the store call itself."""

    __slots__ = ("future", "result")

    def __init__(self) -> None:
        self.result: SendResults | PushgateError | None = None
        self.future: asyncio.Future[None] | None = None

    def __call__(self, result: SendResults | PushgateError) -> None:
        self.result = result
        if self.future is not None and not self.future.done():
            self.future.set_result(None)

    async def wait(self) -> None:
        if self.result is None:
            self.future = asyncio.get_running_loop().create_future()
            await self.future
