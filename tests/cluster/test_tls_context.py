"""The node protocol's TLS configuration without node processes: the context builder
(all-or-none options, missing files, a key of another certificate, a certificate of another
CA), the ``cluster://`` URL options, ``pushgate node``'s flags, and the listener (a
handshake refused and logged once per peer and reason, on real loopback sockets)."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from backend_store.cluster.client.cluster_settings import parse_cluster_url
from backend_store.cluster.client.node_pool import NodeClient
from backend_store.cluster.commands import node_main
from backend_store.cluster.protocol.address import NodeUnreachable
from backend_store.cluster.protocol.connection import Connection
from backend_store.cluster.protocol.stream import NodeStream
from backend_store.cluster.protocol.tls import (
    NodeTls,
    RefusalLog,
    TlsFiles,
    client_context,
    serve_node_protocol,
)
from backend_store.cluster.protocol.tls_certs import make_cluster_certificates
from backend_store.errors import ConfigurationError
from tests.conftest import scaled


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TlsFiles]:
    root = tmp_path_factory.mktemp("tls-certs")
    ours = make_cluster_certificates(root / "ca", ["node", "gateway"])
    theirs = make_cluster_certificates(root / "other", ["stranger"], ca_name="Another CA")
    return {**ours, **theirs}


def test_all_three_files_or_none() -> None:
    assert TlsFiles.from_options(None, None, None, names="a, b and c") is None
    assert TlsFiles.from_options("c.pem", "k.pem", "ca.pem", names="a, b and c") == TlsFiles(
        Path("c.pem"), Path("k.pem"), Path("ca.pem")
    )
    for partial in [("c.pem", None, None), ("c.pem", "k.pem", None), (None, "k.pem", "ca.pem")]:
        with pytest.raises(ConfigurationError, match="TLS needs all of a, b and c, or none"):
            TlsFiles.from_options(*partial, names="a, b and c")


def test_contexts_verify_the_peer_against_the_ca_with_tls_1_2_at_least(certs: dict[str, TlsFiles]) -> None:
    tls = NodeTls.load(certs["node"])
    for context in (tls.server, tls.client):
        assert context.verify_mode == ssl.CERT_REQUIRED  # the server requires a client certificate
        assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert tls.client.check_hostname is False  # the chain is checked against the cluster CA only


def test_a_missing_file_is_named(certs: dict[str, TlsFiles], tmp_path: Path) -> None:
    good = certs["node"]
    missing = tmp_path / "nope.pem"
    for files in (
        TlsFiles(missing, good.key, good.ca),
        TlsFiles(good.cert, missing, good.ca),
        TlsFiles(good.cert, good.key, missing),
    ):
        with pytest.raises(ConfigurationError, match=f"{missing} does not exist"):
            NodeTls.load(files)


def test_a_key_of_another_certificate_is_refused(certs: dict[str, TlsFiles]) -> None:
    node, gateway = certs["node"], certs["gateway"]
    with pytest.raises(ConfigurationError, match="does not belong to the certificate"):
        NodeTls.load(TlsFiles(node.cert, gateway.key, node.ca))


def test_a_certificate_the_ca_did_not_sign_is_refused(certs: dict[str, TlsFiles]) -> None:
    stranger, node = certs["stranger"], certs["node"]
    with pytest.raises(ConfigurationError, match="is not signed by the CA"):
        NodeTls.load(TlsFiles(stranger.cert, stranger.key, node.ca))


def test_an_encrypted_key_is_refused_without_asking_for_a_passphrase(
    certs: dict[str, TlsFiles], tmp_path: Path
) -> None:
    node = certs["node"]
    key = serialization.load_pem_private_key(node.key.read_bytes(), password=None)
    encrypted = tmp_path / "encrypted-key.pem"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    with pytest.raises(ConfigurationError, match="is encrypted"):
        NodeTls.load(TlsFiles(node.cert, encrypted, node.ca))


def test_files_that_are_not_pem_are_refused(certs: dict[str, TlsFiles], tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    node = certs["node"]
    for files in (TlsFiles(junk, node.key, node.ca), TlsFiles(node.cert, node.key, junk)):
        with pytest.raises(ConfigurationError):
            NodeTls.load(files)


def test_the_cluster_url_takes_the_three_paths_or_none(certs: dict[str, TlsFiles]) -> None:
    files = certs["gateway"]
    url = f"cluster://127.0.0.1:2379/p/?tls_cert={files.cert}&tls_key={files.key}&tls_ca={files.ca}"
    _, settings = parse_cluster_url(url)
    assert settings.tls_files() == files
    _, encoded = parse_cluster_url("cluster://h:1?tls_cert=/a%20b/c.pem&tls_key=/k&tls_ca=/ca")
    assert encoded.tls_cert == "/a b/c.pem"
    assert parse_cluster_url("cluster://h:1")[1].tls_files() is None
    with pytest.raises(ConfigurationError, match="tls_cert, tls_key and tls_ca"):
        parse_cluster_url(f"cluster://h:1?tls_cert={files.cert}&tls_ca={files.ca}")


def test_pushgate_node_refuses_partial_or_broken_tls_options(
    certs: dict[str, TlsFiles], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--data", str(tmp_path / "data"), "--etcd", "127.0.0.1:1"]
    files = certs["node"]
    assert node_main([*base, "--tls-cert", str(files.cert), "--tls-key", str(files.key)]) == 2
    assert "TLS needs all of --tls-cert, --tls-key and --tls-ca, or none" in capsys.readouterr().err
    other = certs["gateway"]
    assert (
        node_main(
            [*base, "--tls-cert", str(files.cert), "--tls-key", str(other.key), "--tls-ca", str(files.ca)]
        )
        == 2
    )
    assert "does not belong to the certificate" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()  # refused before anything was made


def test_refusals_are_logged_once_per_peer_and_reason(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    refusals = RefusalLog(every_s=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="pushgate.cluster"):
        for port in range(5):
            refusals.refuse(f"10.0.0.1:{port}", "10.0.0.1", "CERTIFICATE_VERIFY_FAILED")
        refusals.refuse("10.0.0.2:9", "10.0.0.2", "CERTIFICATE_VERIFY_FAILED")
        refusals.refuse("10.0.0.1:7", "10.0.0.1", "WRONG_VERSION_NUMBER")
        now[0] = 61.0
        refusals.refuse("10.0.0.1:8", "10.0.0.1", "CERTIFICATE_VERIFY_FAILED")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "node protocol: refused a TLS connection from 10.0.0.1:0: CERTIFICATE_VERIFY_FAILED",
        "node protocol: refused a TLS connection from 10.0.0.2:9: CERTIFICATE_VERIFY_FAILED",
        "node protocol: refused a TLS connection from 10.0.0.1:7: WRONG_VERSION_NUMBER",
        "node protocol: refused a TLS connection from 10.0.0.1:8: CERTIFICATE_VERIFY_FAILED"
        " (4 more like it from 10.0.0.1 since the last warning)",
    ]
    assert refusals.refused == 8


async def test_the_listener_serves_members_and_refuses_strangers(
    certs: dict[str, TlsFiles], caplog: pytest.LogCaptureFixture
) -> None:
    node = NodeTls.load(certs["node"])
    # Trusting our CA, so that our node's refusal is what is tested (NodeTls.load refuses
    # such a mix at start-up).
    stranger = client_context(TlsFiles(certs["stranger"].cert, certs["stranger"].key, certs["node"].ca))
    served: list[bytes] = []

    hung_up = asyncio.Event()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            served.append(await reader.readexactly(4))
        except asyncio.IncompleteReadError:
            hung_up.set()  # a member that connected and left at once
            return
        writer.write(b"pong")
        await writer.drain()
        writer.close()

    refused_twice = asyncio.Event()

    class CountedRefusals(RefusalLog):
        def refuse(self, peer: str, host: str, reason: str) -> None:
            super().refuse(peer, host, reason)
            if self.refused == 2:
                refused_twice.set()

    refusals = CountedRefusals()
    server = await serve_node_protocol(echo, "127.0.0.1", 0, node.server, refusals)
    port = server.sockets[0].getsockname()[1]

    async def exchange(context: ssl.SSLContext | None, message: bytes = b"ping") -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
        writer.write(message)
        try:
            async with asyncio.timeout(scaled(5)):
                return await reader.read()
        except (ssl.SSLError, ConnectionError):
            return b""
        finally:
            writer.close()

    try:
        with caplog.at_level(logging.DEBUG):
            assert await exchange(NodeTls.load(certs["gateway"]).client) == b"pong"
            # A member that leaves right after its handshake (a health check): no warning
            # from asyncio either (its EOF can arrive before start_tls returned).
            _, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=NodeTls.load(certs["gateway"]).client
            )
            writer.close()
            await asyncio.wait_for(hung_up.wait(), scaled(5))
            assert await exchange(stranger) == b""  # refused: a certificate of another CA
            # Refused: plaintext (longer than a TLS record header, as any node-protocol hello).
            assert await exchange(None, b"ping, in plaintext") == b""
            assert served == [b"ping"]
            await asyncio.wait_for(refused_twice.wait(), scaled(5))  # logged by the server's task
    finally:
        server.close()
        await server.wait_closed()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.name for r in warnings] == ["pushgate.cluster", "pushgate.cluster"]
    assert all("refused a TLS connection from 127.0.0.1:" in r.getMessage() for r in warnings)
    assert not any(r.exc_info for r in caplog.records)  # no traceback, from us or from asyncio


async def test_closing_a_tls_connection_to_a_frozen_peer_does_not_wait_for_it(
    certs: dict[str, TlsFiles],
) -> None:
    """asyncio waits up to 30 s for a TLS peer's close_notify; a node-protocol stream drops a
    peer that does not answer (frozen, SIGSTOPped) after ``CLOSE_TIMEOUT_S``."""
    node, gateway = NodeTls.load(certs["node"]), NodeTls.load(certs["gateway"])
    closed = asyncio.Event()

    async def close_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stream = NodeStream(Connection("node"), reader, writer)
        await reader.readexactly(4)
        await stream.close()
        closed.set()

    server = await serve_node_protocol(close_at_once, "127.0.0.1", 0, node.server)
    port = server.sockets[0].getsockname()[1]
    release = threading.Event()

    def frozen_peer() -> None:
        with gateway.client.wrap_socket(socket.create_connection(("127.0.0.1", port))) as tls:
            tls.sendall(b"ping")
            release.wait(60)  # reads nothing, answers nothing, as a stopped process

    peer = threading.Thread(target=frozen_peer)
    peer.start()
    try:
        # Far below asyncio's own 30 s, far above CLOSE_TIMEOUT_S on a loaded machine.
        await asyncio.wait_for(closed.wait(), 10)
    finally:
        release.set()
        await asyncio.to_thread(peer.join)
        server.close()
        await server.wait_closed()


async def test_a_gateway_that_cannot_verify_a_node_fails_fast_and_warns_once(
    certs: dict[str, TlsFiles], caplog: pytest.LogCaptureFixture
) -> None:
    node = NodeTls.load(certs["node"])
    stranger = NodeTls.load(certs["stranger"])  # trusts another CA only

    async def never_reached(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise AssertionError("the handshake should have failed")

    server = await serve_node_protocol(never_reached, "127.0.0.1", 0, node.server)
    port = server.sockets[0].getsockname()[1]
    client = NodeClient("gateway", "node-a", f"127.0.0.1:{port}", tls=stranger.client, timeout_s=scaled(5))
    try:
        for _ in range(3):
            with pytest.raises(NodeUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
                await client.call("get_queue", 0, tenant="t", name="q")  # never sent: safe to retry
    finally:
        await client.close()
        server.close()
        await server.wait_closed()
    warned = [r for r in caplog.records if "TLS handshake failed" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
