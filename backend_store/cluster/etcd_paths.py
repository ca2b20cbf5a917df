"""Where the cluster keeps things in etcd (docs/cluster.md has the table).

One :class:`EtcdPaths` per cluster, rooted at ``/pushgate/`` by default; tests root theirs
elsewhere so they share one etcd without seeing each other's keys. Values are msgpack maps
except ``meta/``, which holds the gateway's raw bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidRequest
from ..types import QueueName, TenantId

DEFAULT_ROOT = "/pushgate/"
# The embedded store's limit on ``namespace \0 key``; the same here so both refuse alike.
MAX_META_KEY_BYTES = 400


@dataclass(frozen=True, slots=True)
class EtcdPaths:
    root: str = DEFAULT_ROOT

    @property
    def meta(self) -> str:
        return self.root + "meta/"

    @property
    def queues(self) -> str:
        return self.root + "queues/"

    @property
    def partitions(self) -> str:
        return self.root + "partitions/"

    @property
    def leaders(self) -> str:
        return self.root + "leaders/"

    @property
    def nodes(self) -> str:
        return self.root + "nodes/"

    def meta_key(self, namespace: str, key: str) -> str:
        """The etcd key of a metadata value; refuses what the embedded store refuses."""
        if not namespace or "\0" in namespace or "\0" in key:
            raise InvalidRequest("metadata namespace must be non-empty and names free of NUL")
        if "/" in namespace:
            # A "/" would let namespace "a/b" and key "c" alias namespace "a" and key "b/c".
            raise InvalidRequest("metadata namespace must not contain '/'")
        try:
            size = len(namespace.encode()) + 1 + len(key.encode())
        except UnicodeEncodeError:
            raise InvalidRequest("metadata names must be valid Unicode") from None
        if size > MAX_META_KEY_BYTES:
            raise InvalidRequest(f"metadata names must fit in {MAX_META_KEY_BYTES} bytes")
        return f"{self.meta}{namespace}/{key}"

    def split_meta_key(self, key: str) -> tuple[str, str]:
        namespace, _, name = key[len(self.meta) :].partition("/")
        return namespace, name

    def queue_key(self, tenant: str, name: str) -> str:
        if not tenant or "/" in tenant + name or "\0" in tenant + name:
            raise InvalidRequest("tenant and queue names must not contain '/' or NUL")
        try:
            size = len(tenant.encode()) + 1 + len(name.encode())
        except UnicodeEncodeError:
            raise InvalidRequest("tenant and queue names must be valid Unicode") from None
        if size > MAX_META_KEY_BYTES:
            # The embedded store's bound on its keys; a node's store would refuse it later.
            raise InvalidRequest(f"tenant and queue names must fit in {MAX_META_KEY_BYTES} bytes")
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
