"""The cluster's keys in etcd and their values, in one place for nodes, the manager and gateways.

Everything lives under a prefix, ``/pushgate/`` by default (:class:`Layout`); values are msgpack maps (string keys only)::

    nodes/{node_id}        NodeRecord       a node, under its lease (vanishes when it dies)
    manager                manager id       the manager's campaign key: its epoch fences the map
    partitions/{id}        PartitionRecord  the partition map (written by the manager, fenced)
    leaders/{id}           LeaderRecord     a partition leader's campaign key; epoch = create_revision
    queues/{tenant}/{q}    attributes       a queue's attributes (written by gateways)
    meta/{namespace}/{key} raw bytes        the gateways' metadata: tenants, API keys, JWT keys
    drain/{node_id}        b""              an operator's drain request (pushgate manager --drain)
    counters/partition     int              the last partition id allocated
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import InvalidRequest, Unavailable
from ..types import QueueName, TenantId
from .node_storage import NodeStorage

DEFAULT_PREFIX = "/pushgate/"
# The embedded store's limit on ``namespace \0 key`` (and on tenant + queue): the same here,
# so both stores refuse alike.
MAX_META_KEY_BYTES = 400


@dataclass(frozen=True, slots=True)
class Layout:
    """Key names under one prefix (tests and several clusters sharing an etcd use their own)."""

    prefix: str = DEFAULT_PREFIX

    @property
    def nodes(self) -> str:
        return self.prefix + "nodes/"

    @property
    def partitions(self) -> str:
        return self.prefix + "partitions/"

    @property
    def leaders(self) -> str:
        return self.prefix + "leaders/"

    @property
    def queues(self) -> str:
        return self.prefix + "queues/"

    @property
    def drain(self) -> str:
        """``drain/{node_id}``: an operator asked the manager to move everything off the node."""
        return self.prefix + "drain/"

    @property
    def manager(self) -> str:
        return self.prefix + "manager"

    @property
    def partition_counter(self) -> str:
        return self.prefix + "counters/partition"

    def node(self, node_id: str) -> str:
        return self.nodes + node_id

    def partition(self, partition: int) -> str:
        return f"{self.partitions}{partition}"

    def leader(self, partition: int) -> str:
        return f"{self.leaders}{partition}"

    @property
    def meta(self) -> str:
        return self.prefix + "meta/"

    def queue(self, tenant: str, name: str) -> str:
        """A queue's key; refuses names that could alias another key or that the store would refuse."""
        if not tenant or "/" in tenant + name or "\0" in tenant + name:
            raise InvalidRequest("tenant and queue names must not contain '/' or NUL")
        _check_size(tenant, name, "tenant and queue names")
        return f"{self.queues}{tenant}/{name}"

    def tenant_queues(self, tenant: str) -> str:
        if not tenant or "/" in tenant or "\0" in tenant:
            raise InvalidRequest("tenant names must not contain '/' or NUL")
        return f"{self.queues}{tenant}/"

    def split_queue_key(self, key: str) -> tuple[TenantId, QueueName] | None:
        """``(tenant, queue)`` of a full ``queues/`` key (None for a key of another shape)."""
        tenant, sep, name = key[len(self.queues) :].partition("/")
        if not sep or not tenant or not name or "/" in name:
            return None
        return TenantId(tenant), QueueName(name)

    def meta_key(self, namespace: str, key: str) -> str:
        """The key of a metadata value; refuses what the embedded store refuses."""
        if not namespace or "\0" in namespace or "\0" in key:
            raise InvalidRequest("metadata namespace must be non-empty and names free of NUL")
        if "/" in namespace:
            # A "/" would let namespace "a/b" and key "c" alias namespace "a" and key "b/c".
            raise InvalidRequest("metadata namespace must not contain '/'")
        _check_size(namespace, key, "metadata names")
        return f"{self.meta}{namespace}/{key}"

    def split_meta_key(self, key: str) -> tuple[str, str]:
        namespace, _, name = key[len(self.meta) :].partition("/")
        return namespace, name


def _check_size(first: str, second: str, what: str) -> None:
    try:
        size = len(first.encode()) + 1 + len(second.encode())
    except UnicodeEncodeError:
        raise InvalidRequest(f"{what} must be valid Unicode") from None
    if size > MAX_META_KEY_BYTES:
        raise InvalidRequest(f"{what} must fit in {MAX_META_KEY_BYTES} bytes")


def pack(value: Any) -> bytes:
    data: bytes = msgpack.packb(value, use_bin_type=True)
    return data


def unpack(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, raw=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise Unavailable(f"malformed cluster record: {type(exc).__name__}") from None


@dataclass(frozen=True, slots=True)
class ReplicaPosition:
    """What a node publishes of one replica it hosts."""

    role: str  # "leader" | "follower"
    epoch: int  # the replica's fence (highest epoch seen)
    lsn: int  # its last LSN
    last_epoch: int  # the epoch of its last entry (promotion compares (last_epoch, lsn))
    # The epoch of the partition's leader key as this node sees it (0: no leader key). A
    # position published with 0 was taken after the node saw the leader's key vanish.
    leader_epoch: int = 0


@dataclass(frozen=True, slots=True)
class NodeRecord:
    address: str
    state: str = "up"  # "up" | "draining"
    replicas: dict[int, ReplicaPosition] = field(default_factory=dict)
    # Disk and map use (None: not measured yet, or a node of a version that does not publish it).
    storage: NodeStorage | None = None

    def pack(self) -> bytes:
        doc: dict[str, Any] = {
            "address": self.address,
            "state": self.state,
            "replicas": {
                str(p): {
                    "role": r.role,
                    "epoch": r.epoch,
                    "lsn": r.lsn,
                    "last_epoch": r.last_epoch,
                    "leader_epoch": r.leader_epoch,
                }
                for p, r in self.replicas.items()
            },
        }
        if self.storage is not None:
            doc["storage"] = self.storage.to_dict()
        return pack(doc)

    @classmethod
    def unpack(cls, data: bytes) -> NodeRecord:
        v = unpack(data)
        try:
            replicas = {
                int(p): ReplicaPosition(
                    r["role"], r["epoch"], r["lsn"], r.get("last_epoch", 0), r.get("leader_epoch", 0)
                )
                for p, r in v.get("replicas", {}).items()
            }
            storage = NodeStorage.from_dict(v.get("storage"))
            return cls(v["address"], v.get("state", "up"), replicas, storage)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise Unavailable(f"malformed node record: {exc}") from None


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    tenant: str
    queue: str
    index: int
    replicas: tuple[str, ...]
    leader: str | None
    mode: str = "sync"  # "sync" | "async"
    # The create_revision of the queue record it was made for: a queue deleted and created
    # again under the same name gets new partitions, never the old ones (None: not recorded).
    queue_revision: int | None = None

    def pack(self) -> bytes:
        return pack(
            {
                "tenant": self.tenant,
                "queue": self.queue,
                "index": self.index,
                "replicas": list(self.replicas),
                "leader": self.leader,
                "mode": self.mode,
                "queue_revision": self.queue_revision,
            }
        )

    @classmethod
    def unpack(cls, data: bytes) -> PartitionRecord:
        v = unpack(data)
        try:
            return cls(
                v["tenant"],
                v["queue"],
                v["index"],
                tuple(v["replicas"]),
                v.get("leader"),
                v.get("mode", "sync"),
                v.get("queue_revision"),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise Unavailable(f"malformed partition record: {exc}") from None


@dataclass(frozen=True, slots=True)
class LeaderRecord:
    node: str
    address: str

    def pack(self) -> bytes:
        return pack({"node": self.node, "address": self.address})

    @classmethod
    def unpack(cls, data: bytes) -> LeaderRecord:
        v = unpack(data)
        try:
            return cls(v["node"], v["address"])
        except (KeyError, TypeError) as exc:
            raise Unavailable(f"malformed leader record: {exc}") from None


def parse_ids(entries: dict[str, bytes]) -> dict[int, bytes]:
    """``{"12": value}`` (keys relative to a prefix) as ``{12: value}``; other keys are skipped."""
    return {int(k): v for k, v in entries.items() if k.isdigit()}
