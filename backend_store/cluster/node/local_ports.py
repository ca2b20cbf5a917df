"""The ports a node process runs on (:mod:`.ports`): a TCP listener (mutual TLS when asked),
replica stores in LMDB environments under ``DATA/partitions/<id>/``, and the system's clock;
:func:`local_node` builds a :class:`~.node.Node` on them, :func:`run_node` is ``pushgate node``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import ssl
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from ...encryption import Keyring
from ...lmdb_store.checkpoint import JournalGroup
from ...lmdb_store.commit_thread import CommitThread
from ...lmdb_store.engine import LmdbBackend
from ...lmdb_store.writeback import start_writeback
from ...options import StoreOptions
from ...private_files import private_dir, warning_lines
from ...tls_reload import RELOAD_EVERY_S, TlsReloader
from ...types import Epoch
from ..coordination.coordinator import Coordinator
from ..coordination.etcd_tls import EtcdTls
from ..coordination.layout import Layout, PartitionRecord, ServedSet
from ..coordination.storage_record import NodeStorage
from ..coordination.timeline import RecordMark
from ..protocol.address import split_address
from ..protocol.tls import NodeTls, TlsFiles, node_tls_loader, serve_node_protocol
from ..replication.log_shipping import Streams
from .hosted_store import Dial, OpenedReplica, OpenStore
from .node import Node
from .node_config import NodeConfig
from .node_identity import ClusterIdFile
from .partition_host import PartitionHost, Wake
from .ports import AcceptStream
from .receipts import KeptReceipt, keep_receipt, read_receipts
from .remembered_records import forget, read_marks, read_remembered, remember
from .reseed import LmdbReseeder
from .served_sets import forget_served_set, keep_served_set, read_served_sets
from .storage_gauge import StorageGauge

log = logging.getLogger("pushgate.cluster")


class TcpNodeListener:
    """``host:port`` (0: any free port); with ``tls``, mutual TLS only (tls.py)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        advertise: str | None = None,
        tls: NodeTls | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.advertise = advertise
        self.tls = tls
        self._server: asyncio.Server | None = None

    async def listen(self, accept: AcceptStream) -> None:
        server_tls = self.tls.server if self.tls is not None else None
        self._server = await serve_node_protocol(accept, self.host, self.port, server_tls)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def address(self) -> str:
        return self.advertise or f"{self.host}:{self.port}"

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


class LmdbReplicaStores:
    """One LMDB environment per replica under ``data_dir/partitions/<id>/`` (a re-seed's
    leftovers beside it as ``<id>.incoming`` and ``<id>.retired``). ``options``: the stores'
    (no sweeper: a follower's store changes only through the leader's log; the leader sweeps
    every ``sweep_every_s``, PartitionHost, and its deletions replicate like any write).
    ``tls``: the client context leader links to followers dial with."""

    def __init__(
        self,
        node_id: str,
        data_dir: Path,
        options: StoreOptions,
        *,
        sweep_every_s: float = 5.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.node_id = node_id
        self.root = data_dir / "partitions"
        # One thread commits for every replica, into one journal beside them
        # (docs/cluster.md, section 5).
        journal = JournalGroup.of_node(
            self.root,
            interval_s=options.checkpoint_interval_s,
            fdatasync=options.fdatasync or os.fdatasync,
            writeback=options.writeback or start_writeback,
        )
        self.options = dataclasses.replace(options, commit_thread=CommitThread(journal=journal))
        self.sweep_every_s = sweep_every_s
        self.tls = tls

    async def open(self, partition: int, wake: Wake, floor: Callable[[], Epoch]) -> PartitionHost:
        host = PartitionHost(
            partition,
            self.node_id,
            open_lmdb(self.root / str(partition), self.options),
            wake,
            dial=tcp_dial(self.tls),
            sweep_every_s=self.sweep_every_s,
            floor=floor,
        )
        await host.open()
        return host

    async def on_disk(self) -> set[int]:
        return await asyncio.to_thread(self._on_disk)

    def _on_disk(self) -> set[int]:
        if not self.root.is_dir():
            return set()
        return {int(name) for path in self.root.iterdir() if (name := path.name.split(".")[0]).isdigit()}

    def holds(self, partition: int) -> bool:
        return (self.root / str(partition)).is_dir()

    async def delete(self, partition: int, why: str) -> None:
        await asyncio.to_thread(self._delete_directories, partition, why)

    def _delete_directories(self, partition: int, why: str) -> None:
        if not self.root.is_dir():
            return
        for path in self.root.iterdir():
            if path.name.split(".")[0] == str(partition):
                log.info("node %s: deleting %s (%s)", self.node_id, path, why)
                shutil.rmtree(path, ignore_errors=True)


def open_lmdb(path: Path, options: StoreOptions) -> OpenStore:
    """A replica's store as an LMDB environment at ``path``, re-seeded beside it."""

    async def open_store() -> OpenedReplica:
        private_dir(path.parent)
        store = LmdbBackend(path, options)
        # Cluster queues carry replication_factor > 1: replication is the node's job here.
        store.max_replication_factor = 5
        await store.start()
        reseeder = LmdbReseeder(path, options)
        return OpenedReplica(store, reseeder.staging, reseeder.install)

    return open_store


def tcp_dial(tls: ssl.SSLContext | None) -> Dial:
    """Leader links over TCP (with ``tls``: mutual TLS, this client context)."""

    async def dial(address: str) -> Streams:
        host, port = split_address(address)
        return await asyncio.open_connection(host, port, ssl=tls)

    return dial


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await event.wait()


class LocalNodeFiles:
    """The node's files under ``data_dir`` (written off the event loop)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.cluster_id = ClusterIdFile(data_dir)
        self.gauge = StorageGauge(data_dir)

    def new_cluster_id(self) -> str:
        return uuid.uuid4().hex

    async def read_receipts(self) -> dict[int, KeptReceipt]:
        return await asyncio.to_thread(read_receipts, self.data_dir)

    async def keep_receipt(self, partition: int, kept: KeptReceipt) -> None:
        await asyncio.to_thread(keep_receipt, self.data_dir, partition, kept)

    async def read_remembered(self) -> dict[int, PartitionRecord]:
        return await asyncio.to_thread(read_remembered, self.data_dir)

    async def read_marks(self) -> dict[int, RecordMark]:
        return await asyncio.to_thread(read_marks, self.data_dir)

    async def remember(self, partition: int, record: PartitionRecord, mark: RecordMark | None) -> None:
        await asyncio.to_thread(remember, self.data_dir, partition, record, mark)

    async def forget(self, partition: int) -> None:
        await asyncio.to_thread(forget, self.data_dir, partition)

    async def read_served_sets(self) -> dict[int, ServedSet]:
        return await asyncio.to_thread(read_served_sets, self.data_dir)

    async def keep_served_set(self, partition: int, served: ServedSet) -> None:
        await asyncio.to_thread(keep_served_set, self.data_dir, partition, served)

    async def forget_served_set(self, partition: int) -> None:
        await asyncio.to_thread(forget_served_set, self.data_dir, partition)

    async def storage(self, stores: Iterable[object]) -> NodeStorage | None:
        return await self.gauge.current(stores)


def local_node(
    config: NodeConfig,
    coordinator: Coordinator,
    *,
    listener: TcpNodeListener | None = None,
    tls: NodeTls | None = None,
    log_keep: int = 10000,
    sweep_every_s: float = 5.0,
    keyring: Keyring | None = None,
    store_clock: Callable[[], float] | None = None,
    disk_reserve_bytes: int | None = None,
) -> Node:
    """A node on this machine's ports. ``listener``: default 127.0.0.1, any free port (with
    ``tls``); ``tls``: also what leader links dial with.
    The stores: ``log_keep`` replication log entries kept at least; ``keyring``: bodies sealed
    at rest (the same keys on every node: a follower promoted must open what its leader
    sealed); ``store_clock``: the stores' time (message timestamps, visibility, retention,
    dedupe windows; None: ``time.time``; an embedding that holds it still, as the contract
    suite's in-process cluster does, calls ``PartitionHost.sweep_soon`` when it moves it);
    ``disk_reserve_bytes``: room on each replica's disk that sends may not use (docs/store.md,
    "Full disk or map"; None: 2% of the disk, 1 MiB to 1 GiB)."""
    options = StoreOptions(
        replication_log_keep=log_keep,
        sweep_interval_s=0,  # the leader sweeps (LmdbReplicaStores)
        keyring=keyring,
        clock=store_clock,
        disk_reserve_bytes=disk_reserve_bytes,
    )
    replicas = LmdbReplicaStores(
        config.node_id,
        config.data_dir,
        options,
        sweep_every_s=sweep_every_s,
        tls=tls.client if tls is not None else None,
    )
    return Node(
        config,
        coordinator,
        listener or TcpNodeListener(tls=tls),
        replicas,
        SystemClock(),
        LocalNodeFiles(config.data_dir),
    )


async def run_node(
    node_id: str,
    data_dir: Path,
    listen: str,
    etcd: str,
    *,
    advertise: str | None = None,
    ttl_s: float = 2.0,
    prefix: str | None = None,
    quorum_window_s: float | None = None,
    keyring: Keyring | None = None,
    tls: NodeTls | None = None,
    tls_files: TlsFiles | None = None,
    etcd_tls: EtcdTls | None = None,
    disk_reserve_bytes: int | None = None,
) -> None:
    """``pushgate node``: run until cancelled (SIGINT/SIGTERM). ``tls_files``: where ``tls``
    came from, looked at for renewals every 10 s and on SIGHUP (backend_store/tls_reload.py)."""
    from ..coordination.etcd_coordinator import EtcdCoordinator

    for line in warning_lines(data_dir):  # backend_store/private_files.py
        log.warning("%s", line)
    host, port = split_address(listen)
    coordinator = await EtcdCoordinator(etcd, tls=etcd_tls).connect()
    config = NodeConfig(
        node_id,
        data_dir,
        layout=Layout(prefix) if prefix else Layout(),
        ttl_s=ttl_s,
        quorum_window_s=quorum_window_s,
    )
    node = local_node(
        config,
        coordinator,
        listener=TcpNodeListener(host, port, advertise=advertise, tls=tls),
        tls=tls,
        keyring=keyring,
        disk_reserve_bytes=disk_reserve_bytes,
    )
    await node.start()
    secured = " (mutual TLS)" if tls is not None else ""
    print(f"pushgate node {node_id} listening on {node.address}{secured}", flush=True)
    reload: asyncio.Task[None] | None = None
    if tls is not None and tls_files is not None:
        reloader = TlsReloader(
            (tls_files.cert, tls_files.key, tls_files.ca), node_tls_loader(tls), RELOAD_EVERY_S
        )
        reload = asyncio.create_task(reloader.run())
        # Not restarting for a renewal keeps this node's partitions' leaders where they are.
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reloader.check)
    try:
        await asyncio.Event().wait()
    finally:
        if reload is not None:
            reload.cancel()
        await node.stop()
        await coordinator.close()
