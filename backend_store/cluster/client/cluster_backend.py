"""``cluster://etcd-host:port[,...][/root/]``: the :class:`~backend_store.backend.Backend` on
replicated backend nodes, found through etcd.

What it does per request (docs/cluster.md, "The gateway on the cluster"):

- **Metadata** (tenants, keys, limits, queue records) lives in etcd (:mod:`.metadata`);
  changes made by any gateway reach this one's listeners through the watch.
- **Routing.** A queue's partitions and their leaders come from the watched partition map
  (:mod:`.partition_map`); :mod:`.routing` picks the partition of each send and prefixes
  every receipt with its partition id. Each request carries the leader's epoch.
- **Isolation.** One connection per node (the node helper's :class:`~.client.NodePool`),
  a timeout per request and a circuit breaker per node (:mod:`.node_health`): a slow node
  costs only the partitions it leads.
- **Moving leaders.** ``not_leader`` / ``stale_epoch`` re-read the map and retry; a
  partition without a leader is waited for (up to the request deadline). A request whose
  fate is unknown (a timeout, a lost connection) is retried only when that is safe: reads,
  and sends whose every message carries a dedupe id (the partition dedupes the retry).
- **Push.** Nodes send ``Notify`` after commits that made messages visible; it feeds the
  change listeners, so WebSocket delivery stays push across gateways. An idle dispatcher's
  standing receive (``set_demand``) goes to the partitions' leaders (:mod:`.standing`), which
  receive for it inside the sending commit and push the messages back (``Delivery``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from ...attributes import check_number, check_receive
from ...backend import ChangeListener, DeliverCallback, EventListener, MessageEvent
from ...commit_stats import CommitStats
from ...errors import (
    ConfigurationError,
    InvalidReceipt,
    InvalidRequest,
    PushgateError,
    QueueNotFound,
    Unavailable,
)
from ...limits import MAX_RECEIVE_PER_CALL
from ...options import StoreOptions
from ...tls_reload import RELOAD_EVERY_S, TlsReloader
from ...types import (
    AckResult,
    NewMessage,
    PeekedMessage,
    QueueInfo,
    QueueName,
    QueueStats,
    ReceiptFailure,
    ReceivedMessage,
    SendResult,
    StorageUsage,
    TenantId,
)
from ..coordination.coordinator import CoordinatorUnavailable
from ..coordination.etcd_coordinator import EtcdCoordinator
from ..coordination.etcd_tls import EtcdTls
from ..coordination.layout import DEFAULT_PREFIX, Layout
from ..coordination.queue_record import store_attributes
from ..protocol.ops import decode_received
from ..protocol.tls import NodeTls, TlsFiles, node_tls_loader
from ..protocol.wire import Delivery, Events, Notify
from .metadata import ClusterMetadata, MetaListener, QueueListener, QueueRecord
from .node_health import BreakerSettings, NodeHealth
from .node_pool import NodePool
from .partition_calls import PartitionCalls
from .partition_map import ClusterView, LeaderClaim, PartitionInfo, PartitionMap
from .routing import plan_sends, prefix_receipt, split_receipt
from .send_batcher import SendBatcher
from .standing import StandingDemands, Target
from .status_document import cluster_document

log = logging.getLogger("pushgate.cluster")


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """Knobs of the gateway side, from ``cluster://...?name=value`` (or defaults)."""

    root: str = DEFAULT_PREFIX
    # A request's whole budget, retries and waits for a leader included.
    request_deadline_s: float = 10.0
    # One attempt at one node (a sync send waits for a majority fsync within it).
    node_timeout_s: float = 5.0
    # How long ``create_queue`` waits for the manager to place the new queue's partitions.
    placement_wait_s: float = 10.0
    reread_every_s: float = 5.0
    etcd_timeout_s: float = 2.0
    # The replication factor of a queue created without one (docs/api.md's default is 1).
    replication_factor: int = 1
    # Mutual TLS to the nodes (all three PEM paths, or none): tls.py.
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    # TLS to etcd (etcd_tls.py): the CA that signed etcd's certificate; a client certificate
    # and key (together) for an etcd that asks for one.
    etcd_ca: str = ""
    etcd_cert: str = ""
    etcd_key: str = ""
    # 1: sends to a partition wait while one is in flight and go together (send_batcher.py).
    send_batching: int = 1

    def tls_files(self) -> TlsFiles | None:
        return TlsFiles.from_options(
            self.tls_cert, self.tls_key, self.tls_ca, names="tls_cert, tls_key and tls_ca"
        )

    def etcd_tls(self) -> EtcdTls | None:
        return EtcdTls.from_options(
            self.etcd_ca, self.etcd_cert, self.etcd_key, names="etcd_ca, etcd_cert and etcd_key"
        )


def parse_cluster_url(url: str) -> tuple[str, ClusterSettings]:
    """``cluster://h:p,h:p/root/?request_deadline_s=5`` as (endpoints, settings)."""
    parts = urlsplit(url)
    if parts.scheme != "cluster":
        raise ConfigurationError(f"not a cluster URL: {url!r}")
    if not parts.netloc:
        raise ConfigurationError("cluster URL needs etcd endpoints, e.g. cluster://127.0.0.1:2379")
    root = parts.path if parts.path not in ("", "/") else DEFAULT_PREFIX
    root = root if root.endswith("/") else root + "/"
    values: dict[str, Any] = {"root": root}
    known = ClusterSettings.__dataclass_fields__
    for item in filter(None, parts.query.split("&")):
        name, _, raw = item.partition("=")
        if name not in known or name == "root":
            raise ConfigurationError(f"unknown cluster URL option {name!r}")
        if name.startswith(("tls_", "etcd_")) and name != "etcd_timeout_s":
            values[name] = unquote(raw)  # a path
            continue
        try:
            values[name] = int(raw) if name in ("replication_factor", "send_batching") else float(raw)
        except ValueError:
            raise ConfigurationError(f"cluster URL option {name} must be a number") from None
    settings = ClusterSettings(**values)
    # Said now rather than at the first dial: TLS options that do not go together.
    settings.tls_files()
    settings.etcd_tls()
    return parts.netloc, settings


def _sum_stats(parts: Sequence[QueueStats]) -> QueueStats:
    ages = [s.oldest_age_s for s in parts if s.oldest_age_s is not None]
    return QueueStats(
        visible=sum(s.visible for s in parts),
        in_flight=sum(s.in_flight for s in parts),
        delayed=sum(s.delayed for s in parts),
        oldest_age_s=max(ages) if ages else None,
        sent_total=sum(s.sent_total for s in parts),
        acked_total=sum(s.acked_total for s in parts),
        dead_lettered_total=sum(s.dead_lettered_total for s in parts),
    )


class ClusterBackend:
    """The gateway's store in cluster mode. Build with :func:`open_cluster_backend`."""

    def __init__(self, endpoints: str, settings: ClusterSettings, options: StoreOptions) -> None:
        self.endpoints = endpoints
        self.settings = settings
        self.paths = Layout(settings.root)
        self.gateway_id = f"gw-{uuid.uuid4().hex[:8]}"
        self._options = options
        self._coordinator = EtcdCoordinator(
            endpoints, timeout_s=settings.etcd_timeout_s, tls=settings.etcd_tls()
        )
        self.metadata = ClusterMetadata(
            self._coordinator,
            self.paths,
            clock=options.clock or time.time,
            reread_every_s=settings.reread_every_s,
        )
        self.view = ClusterView(self._coordinator, self.paths, reread_every_s=settings.reread_every_s)
        self.health = NodeHealth(BreakerSettings())
        self.calls = PartitionCalls(
            self.view,
            self.metadata,
            self.health,
            deadline_s=settings.request_deadline_s,
            node_timeout_s=settings.node_timeout_s,
        )
        # The node connections while the backend runs (``start`` to ``close``).
        self.pool: NodePool | None = None
        self.send_batcher = SendBatcher(self.calls.call, enabled=settings.send_batching != 0)
        tls_files = settings.tls_files()
        self.tls = NodeTls.load(tls_files) if tls_files is not None else None
        # Renewed files are loaded into self.tls's contexts while the backend runs (ReloadsTls).
        self._tls_reloader = (
            TlsReloader(
                (tls_files.cert, tls_files.key, tls_files.ca), node_tls_loader(self.tls), RELOAD_EVERY_S
            )
            if tls_files is not None and self.tls is not None
            else None
        )
        self._tls_watch: asyncio.Task[None] | None = None
        self._listeners: list[ChangeListener] = []
        self._round_robin = itertools.count()
        self._leaders: dict[int, LeaderClaim | None] = {}
        self._addresses: dict[str, str] = {}  # every node's last known address
        self.standing = StandingDemands()
        self._releases: set[asyncio.Task[None]] = set()
        self._event_listeners: list[EventListener] = []
        self._started = False

    # Life cycle ---------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        try:
            await self._coordinator.connect()
            await self.metadata.start()
            await self.view.start()
        except CoordinatorUnavailable as exc:
            await self.close()
            raise Unavailable(f"cannot reach etcd at {self.endpoints}: {exc.detail}") from None
        self.pool = self.calls.pool = NodePool(
            self.gateway_id,
            on_notify=self._notified,
            on_delivery=self._delivered,
            on_disconnect=self._disconnected,
            on_events=self._events_reported,
            timeout_s=self.settings.node_timeout_s,
            tls=self.tls.client if self.tls is not None else None,
        )
        self.view.add_listener(self._map_changed)
        if self._tls_reloader is not None:
            self._tls_watch = asyncio.create_task(self._tls_reloader.run())
        self._started = True

    def reload_tls(self) -> bool:
        """``ReloadsTls``: look at the TLS files now; whether a renewed set was loaded."""
        return self._tls_reloader is not None and self._tls_reloader.check()

    async def close(self) -> None:
        if self._tls_watch is not None:
            self._tls_watch.cancel()
        # First: a request racing close must not use it.
        pool, self.pool, self.calls.pool = self.pool, None, None
        releases = list(self._releases)
        for task in releases:
            task.cancel()  # their messages come back after their visibility timeout
        if releases:
            await asyncio.wait(releases)
        if pool is not None:
            await pool.close()
        await self.view.close()
        await self.metadata.close()
        await self._coordinator.close()
        self._started = False

    async def check_writable(self) -> None:
        """Ready when etcd answers, holds this cluster (its identity record), and every
        partition of the map has a leader."""
        try:
            await self._coordinator.get(self.paths.prefix + "ready-check")
        except CoordinatorUnavailable as exc:
            raise Unavailable(f"etcd is unreachable: {exc.detail}") from None
        refusal = self.view.identity.refusal
        if refusal is not None:
            raise Unavailable(f"the cluster's metadata cannot be trusted: {refusal}")
        leaderless = self.view.map.leaderless()
        if leaderless:
            names = ", ".join(f"{p.queue}[{p.index}]" for p in leaderless[:5])
            raise Unavailable(f"{len(leaderless)} partition(s) have no leader yet: {names}")

    def add_listener(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    def add_meta_listener(self, listener: MetaListener) -> None:
        """``listener(namespace, key)`` after a metadata value changed anywhere in the cluster."""
        self.metadata.add_meta_listener(listener)

    def add_queue_listener(self, listener: QueueListener) -> None:
        """``listener(tenant, queue)`` after a queue's record changed anywhere in the cluster."""
        self.metadata.add_queue_listener(listener)

    def watched_queue(self, tenant: TenantId, name: QueueName) -> QueueInfo | None:
        """The MetadataWatch capability's queue: the watched record's attributes, no stats
        (asking every partition for stats to read an attribute is what this saves)."""
        record = self.metadata.cached_queue(tenant, name)
        if record is None:
            return None
        return QueueInfo(record.tenant, record.name, record.created_at, record.attributes)

    def _notified(self, node_id: str, notify: Notify) -> None:
        self.standing.saw_notify(notify.partition, notify.tenant, notify.queue)
        self._wake(TenantId(notify.tenant), QueueName(notify.queue))

    # Standing receives (the StandingReceive capability; docs/cluster.md, section 9) ----

    def set_demand(
        self,
        tenant: TenantId,
        queue: QueueName,
        max_messages: int,
        visibility_timeout_s: float | None,
        deliver: DeliverCallback,
        in_memory: bool = False,
    ) -> None:
        """Ask the leaders of the queue's partitions to receive up to ``max_messages`` each
        in the commit of the next send there. Only partitions whose leader this gateway is
        connected to are asked (no dialling here: a dispatcher has received from every
        partition before it idles); the others wake it with ``Notify`` as before.

        ``in_memory`` is not honoured: nodes always receive durably for a remote gateway
        (``node_demands.py`` says why); this backend offers no ``InMemoryReceive``.
        """
        check_receive(max_messages, visibility_timeout_s)
        targets: list[Target] = []
        record = self.metadata.cached_queue(tenant, queue)
        pool = self.pool
        if record is not None and pool is not None:
            for part in self._holders(record):
                leader = part.leader
                client = pool.get(leader.node) if leader is not None else None
                if leader is not None and client is not None and client.address == leader.address:
                    targets.append(Target(part.id, leader.epoch, client))
        self.standing.register(tenant, queue, max_messages, visibility_timeout_s, deliver, targets)

    def clear_demand(self, tenant: TenantId, queue: QueueName, deliver: DeliverCallback) -> None:
        self.standing.withdraw(tenant, queue, deliver)

    def _delivered(self, node_id: str, delivery: Delivery) -> None:
        tenant, queue = TenantId(delivery.tenant), QueueName(delivery.queue)
        try:
            messages = [decode_received(m) for m in delivery.messages]
        except (TypeError, ValueError) as exc:
            log.warning("malformed delivery from node %s: %s", node_id, exc)
            self._wake(tenant, queue)  # its messages come back after their visibility timeout
            return
        for message in messages:
            message.receipt = prefix_receipt(delivery.partition, message.receipt)
        registration = self.standing.delivered(delivery)
        if registration is None:
            self._wake(tenant, queue)  # nobody asked for these any more: released, look again
            self._release(tenant, queue, messages)
            return
        # One commit, one signal: the node sent this gateway no Notify for the commit that
        # served the demand. A short delivery took everything the partition had visible, so
        # it is the commit's only news here (as on the embedded store); after a full one more
        # may be visible, and the listeners are woken for whoever looks next.
        if len(messages) >= registration.max_messages:
            self._wake(tenant, queue)
        try:
            registration.deliver(messages)
        except Exception:
            log.exception("standing receive callback failed")
            return
        if self.standing.look_again(registration, delivery.partition, len(messages)):
            self._wake(tenant, queue)

    # Message events (the MessageEvents capability; docs/cluster.md, section 9) ----------

    def add_event_listener(self, listener: EventListener) -> None:
        """Dead-letter moves and expiries that nodes report to this gateway: each partition's
        leader reports a queue's events to the gateway connection that last received from
        it there (``node_events.py``), so gateways count each once between them."""
        self._event_listeners.append(listener)

    def _events_reported(self, node_id: str, report: Events) -> None:
        events = [
            MessageEvent(TenantId(tenant), QueueName(queue), kind, count)
            for tenant, queue, kind, count in report.events
        ]
        for listener in list(self._event_listeners):
            try:
                listener(events)
            except Exception:
                log.exception("event listener failed")

    def _disconnected(self, node_id: str) -> None:
        # The node forgot this connection's demands (and anything it was pushing into it
        # comes back after its visibility timeout): wake their dispatchers now, so they
        # receive (dialling again) and register anew, rather than at their safety poll.
        if self.pool is None:
            return  # closing
        for tenant, queue in self.standing.sent_to(node_id):
            self._wake(tenant, queue)

    def _release(self, tenant: TenantId, queue: QueueName, messages: list[ReceivedMessage]) -> None:
        async def release() -> None:
            try:
                await self.nack(tenant, [m.receipt for m in messages], 0, queue)
            except PushgateError as exc:
                log.info("releasing %d unclaimed message(s) of %s failed: %s", len(messages), queue, exc.code)

        task = asyncio.create_task(release(), name=f"release {queue}")
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    def _wake(self, tenant: TenantId, queue: QueueName) -> None:
        for listener in list(self._listeners):
            try:
                listener(tenant, queue)
            except Exception:  # one listener's bug must not keep the others from waking
                log.exception("change listener failed")

    def _map_changed(self, new_map: PartitionMap) -> None:
        # A new leader may hold messages nobody told us about (it committed them while we
        # were connected to the old one, or we hold no connection to it yet, so no Notify):
        # wake every queue a partition of which has a new leader. Nodes republish their
        # positions often; those changes wake nothing.
        self._addresses.update((n.id, n.address) for n in new_map.nodes.values())
        old, self._leaders = self._leaders, {pid: p.leader for pid, p in new_map.partitions.items()}
        woken: set[tuple[TenantId, QueueName]] = set()
        for pid, part in new_map.partitions.items():
            if part.leader is not None and old.get(pid) != part.leader:
                woken.add((part.tenant, part.queue))
        for tenant, queue in sorted(woken):
            self._wake(tenant, queue)

    # Queues -----------------------------------------------------------------------

    async def create_queue(
        self, tenant: TenantId, name: QueueName, attributes: Mapping[str, Any]
    ) -> tuple[QueueInfo, bool]:
        if "replication_factor" not in attributes:
            attributes = {**attributes, "replication_factor": self.settings.replication_factor}
        record, created = await self.metadata.create_queue(tenant, name, attributes)
        # The queue is usable once the manager placed its partitions and each has a leader
        # holding it; until then sends would only wait for that anyway.
        count, revision = record.attributes.partitions, record.create_revision
        placed = await self.view.wait_for(
            lambda m: m.complete(tenant, name, count, revision), self.settings.placement_wait_s
        )
        if placed:
            # The first answer from each leader says its store holds the queue.
            return await self._with_stats(record), created
        log.warning(
            "queue %s/%s: partitions not placed within %.0fs", tenant, name, self.settings.placement_wait_s
        )
        return QueueInfo(tenant, name, record.created_at, record.attributes), created

    async def get_queue(self, tenant: TenantId, name: QueueName) -> QueueInfo:
        return await self._with_stats(await self.metadata.queue(tenant, name))

    async def list_queues(self, tenant: TenantId) -> list[QueueInfo]:
        records = await self.metadata.list_queues(tenant)
        return list(await asyncio.gather(*(self._with_stats(r) for r in records)))

    async def update_queue(self, tenant: TenantId, name: QueueName, changes: Mapping[str, Any]) -> QueueInfo:
        record = await self.metadata.update_queue(tenant, name, changes)
        # Partition leaders apply etcd's attributes to their stores when the watch tells
        # them; telling them now as well means the change holds when this call returns.
        plain = store_attributes(changes)
        if plain:
            await self._each_partition(record, "update_queue", retry_unknown=True, name=name, changes=plain)
        return await self._with_stats(record)

    async def delete_queue(self, tenant: TenantId, name: QueueName) -> None:
        record = await self.metadata.queue(tenant, name)
        # Its partitions before the record goes: the manager drops them as soon as it sees
        # that, and our map may lose them before the next line runs. Unplaced ones hold nothing.
        # A dead-letter queue also has a copy in each partition of the queues feeding it
        # (_holders): deleted there too, or their poison messages would keep moving into a
        # queue nobody can read any more (the embedded store keeps them in the source).
        placed = [p for p in self._holders(record) if p.id >= 0]
        await self.metadata.delete_queue(tenant, name)
        # The manager drops the partitions; deleting the queue in them now makes its
        # receipts stop working at once. Best effort: a partition being dropped anyway
        # answers queue_not_found (_check_still_placed), at once.
        results = await asyncio.gather(
            *(self.calls.call(p, "delete_queue", retry_unknown=True, name=name) for p in placed),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, PushgateError):
                raise result

    async def purge_queue(self, tenant: TenantId, name: QueueName) -> int:
        record = await self._record(tenant, name)
        counts = await self._each_holder(record, "purge_queue", name=name)
        return sum(int(c) for c in counts)

    async def _with_stats(self, record: QueueRecord) -> QueueInfo:
        infos = await self._each_holder(record, "get_queue", retry_unknown=True, name=record.name)
        stats = _sum_stats([i.stats for i in infos])
        return QueueInfo(record.tenant, record.name, record.created_at, record.attributes, stats)

    # Messages -----------------------------------------------------------------------

    async def send(
        self, tenant: TenantId, queue: QueueName, messages: Sequence[NewMessage]
    ) -> list[SendResult | PushgateError]:
        record = await self._record(tenant, queue)
        out: list[SendResult | PushgateError | None] = [_unencodable(m) for m in messages]
        # Entries refused here (text that is not UTF-8) fail alone, as on the embedded store.
        valid = [i for i, r in enumerate(out) if r is None]
        plan = plan_sends([messages[i] for i in valid], record.attributes, next(self._round_robin))
        parts = self._parts(record)

        async def send_to(index: int) -> None:
            batch = [messages[valid[i]] for i in plan.by_index[index]]
            # Safe to repeat only if the partition dedupes every message of the batch.
            safe = record.attributes.content_dedupe or all(m.dedupe_id is not None for m in batch)
            results = await self.send_batcher.send(parts[index], queue, batch, safe=safe)
            for position, result in zip(plan.by_index[index], results, strict=True):
                out[valid[position]] = result

        await asyncio.gather(*(send_to(i) for i in plan.by_index))
        return [r if r is not None else Unavailable("no result") for r in out]

    async def receive(
        self,
        tenant: TenantId,
        queue: QueueName,
        max_messages: int,
        visibility_timeout_s: float | None = None,
    ) -> list[ReceivedMessage]:
        # Checked here as the store checks them: the loop below would answer 0 with [].
        check_receive(max_messages, visibility_timeout_s)
        record = await self._record(tenant, queue)
        parts = self._holders(record)
        start = next(self._round_robin) % len(parts)
        got: list[ReceivedMessage] = []
        failure: PushgateError | None = None
        # The partitions in turn, from a rotating start, until the request is filled.
        for part in parts[start:] + parts[:start]:
            if len(got) >= max_messages:
                break
            try:
                batch = await self.calls.call(
                    part,
                    "receive",
                    queue=queue,
                    max_messages=max_messages - len(got),
                    visibility_timeout_s=visibility_timeout_s,
                )
            except Unavailable as exc:
                failure = exc  # one partition down must not starve the others
                continue
            for message in batch:
                message.receipt = prefix_receipt(part.id, message.receipt)
            got.extend(batch)
        if not got and failure is not None:
            raise failure
        return got

    async def ack(
        self, tenant: TenantId, receipts: Sequence[str], queue: QueueName | None = None
    ) -> AckResult:
        return await self._settle_receipts(tenant, receipts, queue, "ack", {})

    async def nack(
        self,
        tenant: TenantId,
        receipts: Sequence[str],
        delay_s: float = 0,
        queue: QueueName | None = None,
    ) -> AckResult:
        return await self._settle_receipts(tenant, receipts, queue, "nack", {"delay_s": delay_s})

    async def _settle_receipts(
        self,
        tenant: TenantId,
        receipts: Sequence[str],
        queue: QueueName | None,
        op: str,
        extra: dict[str, Any],
    ) -> AckResult:
        if queue is not None:
            await self._record(tenant, queue)
        failed: list[ReceiptFailure] = []
        groups: dict[int, list[str]] = {}
        originals: dict[tuple[int, str], str] = {}
        for receipt in receipts:
            part = self._receipt_partition(tenant, receipt, queue)
            if part is None:
                failed.append(ReceiptFailure(receipt, InvalidReceipt.code))
                continue
            pid, inner = part
            groups.setdefault(pid, []).append(inner)
            originals[(pid, inner)] = receipt

        async def settle(pid: int, inner: list[str]) -> AckResult:
            part = self.view.map.partitions.get(pid)
            if part is None:  # dropped from the map since the receipts were checked
                return AckResult(0, [ReceiptFailure(r, InvalidReceipt.code) for r in inner])
            try:
                result: AckResult = await self.calls.call(part, op, receipts=inner, queue=queue, **extra)
            except QueueNotFound:
                # The partition's queue went away: its receipts are dead.
                return AckResult(0, [ReceiptFailure(r, InvalidReceipt.code) for r in inner])
            return result

        results = await asyncio.gather(*(settle(pid, inner) for pid, inner in groups.items()))
        acked = 0
        for pid, result in zip(groups, results, strict=True):
            acked += result.acked
            failed.extend(
                ReceiptFailure(originals.get((pid, f.receipt), f.receipt), f.code) for f in result.failed
            )
        order = {r: i for i, r in enumerate(receipts)}
        failed.sort(key=lambda f: order.get(f.receipt, len(order)))
        return AckResult(acked, failed)

    def receipt_shard(self, receipt: str) -> int | None:
        """The optional ``ReceiptShards`` capability: a receipt's partition (its prefix), so
        the push engine batches acks per partition and a frozen leader stalls only its own."""
        split = split_receipt(receipt)
        return None if split is None else split[0]

    def _receipt_partition(
        self, tenant: TenantId, receipt: str, queue: QueueName | None
    ) -> tuple[int, str] | None:
        split = split_receipt(receipt)
        if split is None:
            return None
        part = self.view.map.partitions.get(split[0])
        if part is None or part.tenant != tenant:
            return None
        if queue is not None and part.queue != queue:
            # Dead letters of ``queue`` live in the partitions of the queues feeding it.
            source = self.metadata.cached_queue(tenant, part.queue)
            if source is None or source.attributes.dead_letter_queue != queue:
                return None
        return split

    async def change_visibility(
        self, tenant: TenantId, queue: QueueName, receipt: str, timeout_s: float
    ) -> None:
        await self._record(tenant, queue)
        split = self._receipt_partition(tenant, receipt, queue)
        if split is None:
            raise InvalidReceipt("receipt is not valid for this queue")
        part = self.view.map.partitions.get(split[0])
        if part is None:
            raise InvalidReceipt("receipt is not valid for this queue")
        await self.calls.call(part, "change_visibility", queue=queue, receipt=split[1], timeout_s=timeout_s)

    async def next_visible_at(self, tenant: TenantId, queue: QueueName) -> float | None:
        record = await self._record(tenant, queue)
        times = await self._each_holder(record, "next_visible_at", retry_unknown=True, queue=queue)
        known = [t for t in times if t is not None]
        return min(known) if known else None

    # Dead letters (the DeadLetters capability) ------------------------------------

    async def peek(self, tenant: TenantId, queue: QueueName, max_messages: int) -> list[PeekedMessage]:
        check_number("max", max_messages, 1, MAX_RECEIVE_PER_CALL, integer=True)
        record = await self._record(tenant, queue)
        batches = await self._each_holder(
            record, "peek", retry_unknown=True, queue=queue, max_messages=max_messages
        )
        merged = sorted((m for batch in batches for m in batch), key=lambda m: (m.sent_at, m.seq))
        return merged[:max_messages]

    async def redrive(self, tenant: TenantId, queue: QueueName, to: QueueName, max_messages: int) -> int:
        check_number("max", max_messages, 1, 100_000, integer=True)
        await self._record(tenant, queue)
        target = await self._record(tenant, to)
        if target.attributes.dead_letter_queue != queue:
            # A partition store holds a queue and its dead-letter queue: the one atomic move
            # there is back into the queue that dead-lettered the message.
            raise InvalidRequest(
                f"in cluster mode, redrive moves dead letters back to a queue whose dead_letter_queue is {queue!r}"
            )
        moved = 0
        for part in self._parts(target):
            if moved >= max_messages:
                break
            moved += int(
                await self.calls.call(part, "redrive", queue=queue, to=to, max_messages=max_messages - moved)
            )
        return moved

    # Metadata -----------------------------------------------------------------------

    async def meta_get(self, namespace: str, key: str) -> bytes | None:
        return await self.metadata.meta_get(namespace, key)

    async def meta_put(self, namespace: str, key: str, value: bytes, *, only_if_absent: bool = False) -> bool:
        return await self.metadata.meta_put(namespace, key, value, only_if_absent=only_if_absent)

    async def meta_delete(self, namespace: str, key: str) -> bool:
        return await self.metadata.meta_delete(namespace, key)

    async def meta_list(self, namespace: str, prefix: str = "") -> list[tuple[str, bytes]]:
        return await self.metadata.meta_list(namespace, prefix)

    # Cluster status (the ClusterStatus capability) ---------------------------------

    async def cluster_status(self) -> Mapping[str, Any]:
        """API.md's ``GET /v1/cluster`` document, from the watched map (no node is asked)."""
        return cluster_document(self.view.map, self._addresses, self.view.identity)

    # Storage use (the StorageStats capability) ------------------------------------

    async def storage_usage(self) -> StorageUsage:
        """The fullest partition environment of any node in the map (the one nearest "map
        full"), from what nodes publish every few seconds; no node is asked. Zeros before
        any node published. Each node's own figures (disk free among them) are in
        :meth:`cluster_status`."""
        published = [n.storage.fullest for n in self.view.map.nodes.values() if n.storage is not None]
        fullest = max((u for u in published if u is not None), key=lambda u: u.used_ratio, default=None)
        return fullest if fullest is not None else StorageUsage(0, 0, 0)

    def commit_stats(self) -> CommitStats | None:
        """None: commits happen on the nodes, not in the gateway."""
        return None

    # Routing ------------------------------------------------------------------------

    async def _record(self, tenant: TenantId, queue: QueueName) -> QueueRecord:
        """The queue's record: the watched copy, or etcd when this gateway has not seen it."""
        record = self.metadata.cached_queue(tenant, queue)
        if record is None:
            record = await self.metadata.queue(tenant, queue)
        return record

    def _parts(self, record: QueueRecord) -> list[PartitionInfo]:
        """The queue's partitions by index; a placeholder for each one not placed yet (its
        calls wait for the manager)."""
        revision = record.create_revision
        placed = {p.index: p for p in self.view.map.of_queue(record.tenant, record.name, revision)}
        return [
            placed.get(i)
            or PartitionInfo(-1, record.tenant, record.name, i, (), None, "sync", queue_revision=revision)
            for i in range(record.attributes.partitions)
        ]

    def _holders(self, record: QueueRecord) -> list[PartitionInfo]:
        """Partitions holding messages of the queue: its own, and (for a dead-letter queue)
        those of the queues that dead-letter into it or did before their ``dead_letter_queue``
        changed, whose stores keep their dead letters."""
        parts = self._parts(record)
        for source in self.metadata.cached_queues(record.tenant):
            if source.holds_dead_letters_of(record):
                parts.extend(self.view.map.of_queue(source.tenant, source.name, source.create_revision))
        return parts

    async def _each_partition(
        self, record: QueueRecord, op: str, *, retry_unknown: bool = False, **kwargs: Any
    ) -> list[Any]:
        calls = (self.calls.call(p, op, retry_unknown=retry_unknown, **kwargs) for p in self._parts(record))
        return list(await asyncio.gather(*calls))

    async def _each_holder(
        self, record: QueueRecord, op: str, *, retry_unknown: bool = False, **kwargs: Any
    ) -> list[Any]:
        calls = (self.calls.call(p, op, retry_unknown=retry_unknown, **kwargs) for p in self._holders(record))
        return list(await asyncio.gather(*calls))


def _unencodable(message: NewMessage) -> InvalidRequest | None:
    """An error for a message whose text cannot travel (a lone surrogate is a Python str but
    not UTF-8); None if it can."""
    texts = [message.group_id, message.dedupe_id, *message.attributes, *message.attributes.values()]
    try:
        for text in texts:
            if text is not None:
                text.encode()
    except UnicodeEncodeError:
        return InvalidRequest("group_id, dedupe_id and attributes must be valid Unicode text")
    return None


def open_cluster_backend(url: str, options: StoreOptions) -> ClusterBackend:
    """Build (not start) the cluster backend a ``cluster://`` URL names."""
    endpoints, settings = parse_cluster_url(url)
    return ClusterBackend(endpoints, settings, options)
