"""The ports a node process runs on (:mod:`.ports`): a TCP listener (mutual TLS when asked),
replica stores in LMDB environments under ``DATA/partitions/<id>/``, and the system's clock;
:func:`local_node` builds a :class:`~.node.Node` on them, :func:`run_node` is ``pushgate node``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import signal
import ssl
import time
from collections.abc import Callable
from pathlib import Path

from ...encryption import Keyring
from ...options import StoreOptions
from ...types import Epoch
from ...tls_reload import RELOAD_EVERY_S, TlsReloader
from ..coordination.coordinator import Coordinator
from ..coordination.etcd_tls import EtcdTls
from ..coordination.layout import Layout
from ..protocol.tls import NodeTls, TlsFiles, node_tls_loader, serve_node_protocol
from .node import Node
from .node_config import NodeConfig
from .partition_host import PartitionHost, Wake
from .ports import AcceptStream

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
        self.options = options
        self.sweep_every_s = sweep_every_s
        self.tls = tls

    async def open(self, partition: int, wake: Wake, floor: Callable[[], Epoch]) -> PartitionHost:
        host = PartitionHost(
            partition,
            self.root / str(partition),
            self.node_id,
            self.options,
            wake,
            sweep_every_s=self.sweep_every_s,
            tls=self.tls,
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


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await event.wait()


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
    return Node(config, coordinator, listener or TcpNodeListener(tls=tls), replicas, SystemClock())


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
    from ..protocol.address import split_address

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
