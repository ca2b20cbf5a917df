"""What a node keeps of its cluster's identity on its own disk (docs/cluster.md, "Cluster identity").

- ``DATA/cluster-id``: the cluster id, one line, written once (as Kafka's ``cluster.id`` in
  ``meta.properties``). A node that keeps one never creates a cluster, and refuses an etcd
  that holds no id or another one (:mod:`..coordination.identity`).
- Each replica's store holds a :class:`~.reconcile.ReplicaLabel` (its cluster id and the
  partition's queue), outside the replicated log, so a replica directory from another
  cluster, or from a partition id reused after an etcd restore, is recognised.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Protocol

import msgpack

from ..coordination.coordinator import Coordinator, CoordinatorUnavailable, Entry, PrefixState
from ..coordination.identity import (
    ClusterRecord,
    IdentityVerdict,
    NodeJudgement,
    founding_refusal,
    judge_node,
)
from ..coordination.layout import ClusterIdentity, Layout
from ..coordination.timeline import Timeline, raise_incarnation_past
from ..coordination.watched_prefix import WatchedPrefix
from .durable_file import write_durably
from .hosted_store import HostedStore
from .reconcile import ReplicaLabel

log = logging.getLogger("pushgate.cluster")

CLUSTER_ID_FILE = "cluster-id"


def read_cluster_id(data_dir: Path) -> str | None:
    path = data_dir / CLUSTER_ID_FILE
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return text or None


def keep_cluster_id(data_dir: Path, cluster_id: str) -> None:
    """Write ``DATA/cluster-id`` durably."""
    write_durably(data_dir / CLUSTER_ID_FILE, (cluster_id + "\n").encode())


def pack_label(label: ReplicaLabel) -> bytes:
    data: bytes = msgpack.packb(
        {
            "cluster_id": label.cluster_id,
            "partition": label.partition,
            "tenant": label.tenant,
            "queue": label.queue,
            "index": label.index,
            "queue_revision": label.queue_revision,
        },
        use_bin_type=True,
    )
    return data


def unpack_label(data: bytes | None) -> ReplicaLabel | None:
    """The label (None: none, or one this version cannot read: treated as unlabelled)."""
    if data is None:
        return None
    try:
        v = msgpack.unpackb(data, raw=False)
        revision = v.get("queue_revision")
        return ReplicaLabel(
            str(v["cluster_id"]),
            int(v["partition"]),
            str(v["tenant"]),
            str(v["queue"]),
            int(v["index"]),
            None if revision is None else int(revision),
        )
    except (ValueError, TypeError, KeyError, AttributeError, msgpack.UnpackException):
        return None


async def read_label(store: HostedStore) -> ReplicaLabel | None:
    return unpack_label(await store.replica_label())


class KeptClusterId(Protocol):
    """Where a node keeps its cluster's id (written once, when it first joins one)."""

    @property
    def where(self) -> str:
        """Named in the node's log."""

    async def read(self) -> str | None: ...

    async def keep(self, cluster_id: str) -> None:
        """Durably: a node that joined a cluster must not forget it."""


class ClusterIdFile:
    """``DATA/cluster-id``."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir

    @property
    def where(self) -> str:
        return str(self.data_dir / CLUSTER_ID_FILE)

    async def read(self) -> str | None:
        return await asyncio.to_thread(read_cluster_id, self.data_dir)

    async def keep(self, cluster_id: str) -> None:
        await asyncio.to_thread(keep_cluster_id, self.data_dir, cluster_id)


class NodeIdentity:
    """The node's side of the identity rules: what it keeps, what etcd holds, the verdict.

    ``record`` is the one the watch of the ``cluster`` key holds (``watch``), and only that:
    a record read or written outside the watch is applied to it (``WatchedPrefix.refresh``).
    A copy kept apart from the watch went stale for good when etcd was restored again before
    the watch had seen this node's own raise of the incarnation: the restored record equals
    the watch's, so no change was ever delivered, and the node kept the raised incarnation,
    holding off every campaign as "designated before etcd went back in time" (simulation
    seed ``etcd`` 100, session 33). :meth:`judge` applies
    :func:`~..coordination.identity.judge_node`, creating the cluster id in etcd or adopting
    etcd's when the rules say so, and logs each new refusal once (one line)."""

    def __init__(
        self,
        node_id: str,
        kept_id: KeptClusterId,
        coordinator: Coordinator,
        layout: Layout,
        *,
        new_cluster_id: Callable[[], str] = lambda: uuid.uuid4().hex,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``kept_id``: where the node keeps its cluster's id (``DATA/cluster-id``:
        :class:`ClusterIdFile`). A cluster this node founds gets ``new_cluster_id()``, made
        at ``wall_clock()``."""
        self.node_id = node_id
        self.kept_id = kept_id
        self.coordinator = coordinator
        self.layout = layout
        self._new_cluster_id = new_cluster_id
        self._wall_clock = wall_clock
        self.kept: str | None = None
        self.watch = WatchedPrefix(coordinator, layout.cluster, reread_every_s=2.0)
        self._parsed: tuple[Entry | None, ClusterRecord] | None = None
        self.verdict = IdentityVerdict(refusal="the cluster record was not read yet")
        self._loaded = False
        self._trusted_before = False
        # The newest epoch this node knows etcd made: its replicas' fences, the leader keys'
        # epochs and the states its watches delivered (coordination/timeline.py).
        self.timeline = Timeline()

    @property
    def record(self) -> ClusterRecord | None:
        """The cluster record as the watch holds it (None: not read yet)."""
        if not self.watch.loaded:
            return None
        entry = self.watch.state.entries.get(self.layout.cluster)
        if self._parsed is None or self._parsed[0] is not entry:
            self._parsed = (entry, ClusterRecord.parse(entry.value if entry is not None else None))
        return self._parsed[1]

    @property
    def incarnation(self) -> int:
        found = self.record.identity if self.record is not None else None
        return found.incarnation if found is not None else 0

    @property
    def cluster_value(self) -> bytes | None:
        """The cluster record's bytes as the watch holds them (None: not read, or absent)."""
        entry = self.watch.state.entries.get(self.layout.cluster) if self.watch.loaded else None
        return entry.value if entry is not None else None

    async def raise_incarnation_past(self, epoch: int) -> bool:
        """If etcd went back in time (it cannot make an epoch newer than ``epoch``, a
        replica's fence or what this node remembers: it was restored from an older
        snapshot), raise the cluster's incarnation past it, so that epochs keep growing;
        return whether etcd was behind (:mod:`..coordination.timeline`)."""
        outcome = await raise_incarnation_past(self.coordinator, self.layout, self.kept, epoch)
        if outcome is None:
            return False
        await self.watch.refresh()
        if outcome.raised_to is not None:
            log.warning(
                "node %s: etcd is behind epoch %d that this node remembers: etcd went back in"
                " time (restored from a snapshot?); raised the cluster's incarnation to %d",
                self.node_id,
                epoch,
                outcome.raised_to,
            )
        raised = outcome.record.identity
        self.timeline.settle(raised.incarnation if raised is not None else 0, outcome.revision)
        return outcome.behind

    async def settle_timeline(self) -> bool:
        """Whether etcd is known not to be behind what this node remembers (settling a
        suspicion on a fresh read first, raising the incarnation if it is behind): a node
        campaigns only then."""
        if self.timeline.suspect:
            await self.raise_incarnation_past(self.timeline.high_water)
        return not self.timeline.suspect

    def observe(self, state: PrefixState) -> None:
        """A watch delivered ``state``: is etcd behind what this node remembers?"""
        self.timeline.observe(self.incarnation, state.revision)

    async def refusal_now(self) -> str | None:
        """Why etcd, read directly now, is not this node's cluster (None: it is). Asked
        before a deletion, the one act that cannot be undone: the watches are apart, and
        after etcd is wiped the tombstones' can show the new etcd before the cluster
        record's does (a CI run of session 32: a node deleted a replica on a tombstone a
        manager wrote into the emptied etcd, 0.1 s before it refused that etcd)."""
        try:
            entry = await self.coordinator.get(self.layout.cluster)
        except CoordinatorUnavailable as exc:
            return f"etcd cannot be read: {exc}"
        record = ClusterRecord.parse(entry.value if entry is not None else None)
        judgement = judge_node(record, self.kept, holds_replicas=True, etcd_has_map=True, layout=self.layout)
        return judgement.verdict.refusal

    async def _record_read(self) -> ClusterRecord:
        """The watch's record, read first if the watch holds none yet."""
        if self.record is None:
            await self.watch.refresh()
        record = self.record
        if record is None:  # a refresh takes a first state whole: not expected
            raise CoordinatorUnavailable("the cluster record was not read yet")
        return record

    async def judge(
        self,
        *,
        holds_replicas: bool,
        etcd_has_map: bool,
        refusing: Callable[[], Awaitable[Collection[str]]],
    ) -> IdentityVerdict:
        """Judge etcd's cluster record against this node's id; create the id or adopt
        etcd's where the rules say so. ``refusing``: the other nodes registered in etcd as
        refusing it (asked only before creating an id)."""
        if not self._loaded:
            self.kept = await self.kept_id.read()
            self._loaded = True
        judgement = judge_node(
            await self._record_read(),
            self.kept,
            holds_replicas=holds_replicas,
            etcd_has_map=etcd_has_map,
            layout=self.layout,
        )
        if judgement.create and (refusal := founding_refusal(await refusing(), self.layout)):
            judgement = NodeJudgement(IdentityVerdict(None, refusal))
        if judgement.create:
            made = ClusterIdentity(self._new_cluster_id(), 0, self._wall_clock())
            if await self.coordinator.create(self.layout.cluster, made.pack()):
                log.warning(
                    "node %s: created cluster %s in etcd (%s)",
                    self.node_id,
                    made.cluster_id,
                    self.layout.cluster,
                )
            await self.watch.refresh()  # ours, or another node's first
            judgement = judge_node(
                await self._record_read(),
                self.kept,
                holds_replicas=holds_replicas,
                etcd_has_map=etcd_has_map,
                layout=self.layout,
            )
        if judgement.adopt is not None:
            await self.kept_id.keep(judgement.adopt)
            self.kept = judgement.adopt
            log.warning(
                "node %s: belongs to cluster %s (kept in %s)", self.node_id, self.kept, self.kept_id.where
            )
        verdict = judgement.verdict
        if verdict.refusal is not None and verdict.refusal != self.verdict.refusal:
            log.error("node %s: %s", self.node_id, verdict.refusal)
        elif verdict.refusal is None and self.verdict.refusal is not None and self._trusted_before:
            log.warning("node %s: etcd holds cluster %s again; serving", self.node_id, verdict.cluster_id)
        self._trusted_before = self._trusted_before or verdict.refusal is None
        self.verdict = verdict
        return verdict
