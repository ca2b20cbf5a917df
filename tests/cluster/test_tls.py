"""Mutual TLS on the node protocol with real processes: three ``pushgate node`` processes and a
manager started with ``--tls-*`` (certificates made here, by the cluster CA), real etcd, real
TCP. One cluster for the module.

- it replicates: a sync send through a gateway on ``cluster://...?tls_*`` is acknowledged,
  every replica holds the same log, and it is read back;
- a client with no certificate, with one from another CA, or speaking plaintext gets no
  answer at all from a node (refused at the handshake, logged once with its address);
- a leader link from a node with another CA's certificate replicates nothing into a follower,
  where the same link with a certificate of the cluster's CA is answered;
- after the leader's SIGKILL everything re-dials over TLS: the new leader's links, the
  gateway, the restarted node.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import pytest_asyncio

from backend_store.cluster.client.cluster_backend import ClusterBackend, open_cluster_backend
from backend_store.cluster.client.node_pool import NodeClient
from backend_store.cluster.coordination.layout import ReplicaPosition
from backend_store.cluster.node.local_ports import tcp_dial
from backend_store.cluster.protocol.address import split_address
from backend_store.cluster.protocol.connection import Connection, Event
from backend_store.cluster.protocol.tls import NodeTls, TlsFiles
from backend_store.cluster.protocol.tls_certs import make_cluster_certificates
from backend_store.cluster.protocol.wire import ErrorReply, Hello, Reply
from backend_store.cluster.replication.log_shipping import ReplicationLeader
from backend_store.errors import Unavailable
from backend_store.lmdb_store.engine import LmdbBackend
from backend_store.options import StoreOptions
from backend_store.types import Epoch, NewMessage, QueueName, SendResult, TenantId
from tests.conftest import scaled
from tests.fixtures.etcd_server import unique_prefix

from .processes import ClusterHarness
from .workload import RF3_SYNC, Q, T, has_replicas, replicated_everywhere

pytestmark = pytest.mark.asyncio(loop_scope="module")

NODES = ["n0", "n1", "n2"]


@dataclass
class TlsCluster:
    h: ClusterHarness
    certs: dict[str, TlsFiles]  # signed by the cluster's CA: the nodes and "gateway"
    foreign: dict[str, TlsFiles]  # signed by another CA
    gateway: NodeTls
    backend: ClusterBackend
    partition: int


def _tls_url(h: ClusterHarness, files: TlsFiles) -> str:
    query = f"tls_cert={files.cert}&tls_key={files.key}&tls_ca={files.ca}&node_timeout_s={scaled(5)}"
    return f"cluster://{','.join(h.endpoints)}{h.prefix}?{query}"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(
    etcd_endpoints: list[str], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[TlsCluster]:
    root = tmp_path_factory.mktemp("tls-cluster")
    certs = make_cluster_certificates(root / "ca", [*NODES, "gateway"])
    foreign = make_cluster_certificates(root / "other-ca", ["rogue"], ca_name="Another CA")
    gateway = NodeTls.load(certs["gateway"])

    def node_tls(name: str) -> list[str]:
        files = certs[name]
        return ["--tls-cert", str(files.cert), "--tls-key", str(files.key), "--tls-ca", str(files.ca)]

    h = ClusterHarness(etcd_endpoints, root, unique_prefix("tls") + "/")
    backend: ClusterBackend | None = None
    try:
        await h.start(nodes=3, managers=1, node_args=node_tls, client_tls=gateway.client)
        backend = open_cluster_backend(_tls_url(h, certs["gateway"]), StoreOptions())
        await backend.start()
        await backend.create_queue(TenantId(T), QueueName(Q), dict(RF3_SYNC))
        pid = await h.partition_of(T, Q)
        await h.wait_for("three replicas", lambda: has_replicas(h, pid, 3))
        await h.serving_leader(pid)
        yield TlsCluster(h, certs, foreign, gateway, backend, pid)
    finally:
        if backend is not None:
            await backend.close()
        await h.close()


async def test_a_tls_cluster_replicates_and_a_gateway_reads_it_back(cluster: TlsCluster) -> None:
    h, backend, pid = cluster.h, cluster.backend, cluster.partition
    [sent] = await backend.send(TenantId(T), QueueName(Q), [NewMessage(b"over-tls", dedupe_id="tls-1")])
    assert isinstance(sent, SendResult), sent  # sync, RF 3: a majority fsynced it
    # Every replica (the leader's links to its followers are TLS too) holds the same log.
    lsn = await replicated_everywhere(h, pid, NODES)
    assert lsn >= 1
    peeked = await h.read_queue(pid, T, Q)  # the harness's NodeClient, with the gateway's cert
    assert peeked == ["over-tls"]
    got = await backend.receive(TenantId(T), QueueName(Q), 10)
    assert [m.body for m in got] == [b"over-tls"]
    assert (await backend.ack(TenantId(T), [got[0].receipt])).acked == 1
    for name in NODES:
        log = h.nodes[name].log_tail(200_000)
        assert "(mutual TLS)" in log
        assert "refused a TLS connection" not in log  # members never refuse each other


async def _raw_attempt(address: str, context: ssl.SSLContext | None) -> tuple[list[Event], int | None]:
    """Dial like a gateway (hello, then a request) and read until an answer or the end: the
    hellos and replies that came back, and the local port the node saw (None if our side
    refused the node)."""
    host, port = split_address(address)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # the port first: the node's log names it
    sock.setblocking(False)
    local_port = int(sock.getsockname()[1])
    await asyncio.get_running_loop().sock_connect(sock, (host, port))
    hostname = host if context is not None else None
    try:
        opening = asyncio.open_connection(sock=sock, ssl=context, server_hostname=hostname)
        reader, writer = await asyncio.wait_for(opening, scaled(5))
    except ssl.SSLError:
        sock.close()
        return [], None
    conn = Connection("intruder")
    conn.request("get_queue", 0, Epoch(0), {"tenant": T, "name": Q})
    writer.write(conn.data_to_send())
    events: list[Event] = []
    try:
        async with asyncio.timeout(scaled(10)):
            while data := await reader.read(65536):
                conn.receive_data(data)
                events += conn.events_received()
                if any(isinstance(e, Reply | ErrorReply) for e in events):
                    break  # answered (the control); a node keeps a gateway's connection open
    except (ssl.SSLError, ConnectionError):
        pass  # the node's refusal (a TLS alert) ends the stream
    writer.close()
    return [e for e in events if isinstance(e, Hello | Reply | ErrorReply)], local_port


def _context(files: TlsFiles | None, trust: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_verify_locations(cafile=trust)
    if files is not None:
        context.load_cert_chain(files.cert, files.key)
    return context


async def test_clients_without_a_cluster_certificate_get_no_answer(cluster: TlsCluster) -> None:
    h, pid = cluster.h, cluster.partition
    leader, address, epoch = await h.serving_leader(pid)
    ca = cluster.certs["gateway"].ca
    # The control: the same dial with the cluster CA's certificate is answered.
    answered, _ = await _raw_attempt(address, cluster.gateway.client)
    assert [type(e) for e in answered] == [Hello, ErrorReply]  # not_leader: partition 0

    rogue = cluster.foreign["rogue"]
    attempts = {
        "no certificate": _context(None, ca),
        "a certificate of another CA": _context(rogue, ca),
        "plaintext": None,
    }
    ports: dict[str, int | None] = {}
    for what, context in attempts.items():
        events, ports[what] = await _raw_attempt(address, context)
        assert events == [], f"{what}: the node answered {events}"
        # And through the gateway's own client: unavailable, never a result.
        client = NodeClient("intruder", leader, address, tls=context, timeout_s=scaled(5))
        try:
            with pytest.raises(Unavailable):
                await client.call("get_queue", pid, epoch, tenant=T, name=Q)
        finally:
            await client.close()

    log = h.nodes[leader]
    for what, port in ports.items():
        assert port is not None  # these three are refused by the node, not by our side
        line = f"refused a TLS connection from 127.0.0.1:{port}:"
        await h.wait_for(f"the node to log {what}", _logged(log.log_tail, line))
    text = log.log_tail(200_000)
    assert "Traceback" not in text
    # Once per peer and reason: the second client of each kind was not logged again.
    assert text.count("refused a TLS connection") == len(attempts)


def _logged(tail: object, line: str) -> object:
    async def check() -> bool:
        assert callable(tail)
        return line in tail(200_000)

    return check


def _warned(caplog: pytest.LogCaptureFixture, text: str) -> object:
    async def check() -> bool:
        return any(r.levelno == logging.WARNING and text in r.getMessage() for r in caplog.records)

    return check


async def test_a_leader_link_with_another_cas_certificate_replicates_nothing(
    cluster: TlsCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h, pid = cluster.h, cluster.partition
    leader, _, epoch = await h.serving_leader(pid)
    follower = next(n for n in NODES if n != leader)

    async def follower_position() -> ReplicaPosition | None:
        # Positions are published every 0.5 s: wait for one taken in the leader's term.
        position = (await h.node_records())[follower].replicas.get(pid)
        return position if position is not None and position.epoch == epoch else None

    before = await h.wait_for("the follower's position in the current term", follower_position)
    host, port = split_address(h.addresses[follower])

    async def rogue_leader(name: str, term: Epoch) -> ReplicationLeader:
        """A leader of ``pid`` at ``term`` with one entry to ship, in a store of its own."""
        store = LmdbBackend(tmp_path / name, StoreOptions(replication_log_keep=100))
        await store.start()
        stores.append(store)
        rogue = ReplicationLeader(store, partition=pid, epoch=term, replicas=3, node_id=name)
        await rogue.start()
        await store.create_queue(TenantId(T), QueueName(Q), {})
        await store.send(TenantId(T), QueueName(Q), [NewMessage(b"forged")])
        return rogue

    stores: list[LmdbBackend] = []
    rogues: list[tuple[ReplicationLeader, ssl.SSLContext]] = []
    # A newer term than the real leader's: a follower that took it would be fenced by it.
    foreign = NodeTls.load(cluster.foreign["rogue"])
    rogues.append((await rogue_leader("rogue-trusting-its-ca", Epoch(epoch + 1000)), foreign.client))
    mixed = _context(cluster.foreign["rogue"], cluster.certs["gateway"].ca)  # trusts ours, not ours
    rogues.append((await rogue_leader("rogue-trusting-ours", Epoch(epoch + 1000)), mixed))
    # The control: an old term with a certificate of the cluster's CA is answered (refused
    # as stale by the follower, which deposes it).
    rogues.append((await rogue_leader("stale-member", Epoch(1)), cluster.gateway.client))
    links = [
        asyncio.create_task(r.maintain(follower, partial(tcp_dial(context), f"{host}:{port}"), retry_s=0.05))
        for r, context in rogues
    ]
    try:
        control = rogues[2][0]
        await asyncio.wait_for(control.deposed.wait(), scaled(10))
        assert control.newer_epoch is not None and control.newer_epoch >= epoch
        # The follower refused the certificate of the rogue that trusts our CA; the other
        # rogue refused the follower's certificate itself (its warning, below).
        await h.wait_for(
            "the follower to refuse the other CA's certificate",
            _logged(h.nodes[follower].log_tail, "CERTIFICATE_VERIFY_FAILED"),
        )
        await h.wait_for("the rogue to log its refused handshake", _warned(caplog, "TLS handshake with"))
        for rogue, _ in rogues[:2]:
            assert not rogue.deposed.is_set()  # no answer ever came
            progress = rogue.followers.get(follower)
            assert progress is None or (not progress.positioned and progress.acked < 1)
    finally:
        for task in links:
            task.cancel()
        await asyncio.gather(*links, return_exceptions=True)
        for store in stores:
            await store.close()
    # The follower's fence never saw the rogues' term, nor its log their entries (the real
    # leader's own writes may have moved its LSN); the real leader still replicates to it.
    after = (await h.node_records())[follower].replicas[pid]
    assert before.epoch == after.epoch == epoch
    assert after.last_epoch <= epoch
    await h.send_until_ok(pid, T, Q, "after-the-rogues")
    await replicated_everywhere(h, pid, NODES)
    assert (await h.serving_leader(pid))[2] == epoch


async def test_a_failover_re_dials_everything_over_tls(cluster: TlsCluster) -> None:
    """The leader SIGKILLed: the new leader's links, the gateway's new connection and the
    restarted node's rejoining all go through TLS handshakes again."""
    h, backend, pid = cluster.h, cluster.backend, cluster.partition
    victim, _, epoch = await h.serving_leader(pid)
    h.nodes[victim].kill()
    _, _, new_epoch = await h.serving_leader(pid, not_node=victim)
    assert new_epoch > epoch
    [sent] = await backend.send(TenantId(T), QueueName(Q), [NewMessage(b"after-failover", dedupe_id="tls-2")])
    assert isinstance(sent, SendResult), sent  # sync: the one surviving follower holds it
    logged_before = h.nodes[victim].log_path.stat().st_size
    h.nodes[victim].start()  # rejoins as a follower, caught up over a TLS link
    await replicated_everywhere(h, pid, NODES)
    assert "after-failover" in await h.read_queue(pid, T, Q)
    since_restart = h.nodes[victim].log_path.read_text(errors="replace")[logged_before:]
    assert "(mutual TLS)" in since_restart
    assert "refused a TLS connection" not in since_restart
