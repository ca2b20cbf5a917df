"""A node's renewed TLS files are loaded without a restart (backend_store/tls_reload.py,
``node_tls_loader`` in cluster/protocol/tls.py), with a real ``pushgate node`` process, real
etcd and real TLS clients.

What an operator relies on: a renewed certificate is served after SIGHUP (or the next look, 10
s) by the same process, so its partitions' leaders stay put; a pair caught half-written is
not loaded and the node serves on with the old one; a CA added to the CA file is trusted
from then on (the first step of a CA rotation), with no restart.
"""

from __future__ import annotations

import asyncio
import datetime
import signal
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from backend_store.cluster.client.cluster_backend import ClusterBackend, open_cluster_backend
from backend_store.cluster.protocol.address import split_address
from backend_store.cluster.protocol.tls import TlsFiles
from backend_store.cluster.protocol.tls_certs import make_cluster_certificates
from backend_store.errors import Unavailable
from backend_store.options import StoreOptions
from backend_store.types import NewMessage, QueueName, SendResult, TenantId
from tests.conftest import scaled
from tests.fixtures.etcd_server import unique_prefix
from tests.fixtures.process_files import replace_file

from .processes import ClusterHarness, ClusterProcess
from .workload import Q, T


def _renewed(ca_dir: Path, member: str, out: Path) -> tuple[bytes, bytes]:
    """A new certificate and key for ``member``, signed by the CA in ``ca_dir`` (as a renewal
    is): PEM bytes, not written anywhere yet."""
    ca_key = serialization.load_pem_private_key((ca_dir / "ca-key.pem").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_cert = x509.load_pem_x509_certificate((ca_dir / "ca.pem").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{member} renewed")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=60))
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _context(files: TlsFiles, trust: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_verify_locations(cafile=trust)
    context.load_cert_chain(files.cert, files.key)
    return context


def _handshake(address: str, context: ssl.SSLContext) -> bytes | None:
    """The node's certificate (DER), or None when it refused us."""
    host, port = split_address(address)
    with socket.create_connection((host, port), timeout=scaled(5)) as raw:
        try:
            with context.wrap_socket(raw) as tls:
                der = tls.getpeercert(binary_form=True)
                # A node says hello first. TLS 1.3: it checks our certificate after its own
                # Finished, so a refusal comes instead, as an alert (or the end) on this read.
                if not tls.recv(1):
                    return None
        except (ssl.SSLError, ConnectionError):
            return None
    return der


def _serves(address: str, context: ssl.SSLContext, expected: bytes) -> Callable[[], Awaitable[bool]]:
    """A check for ``ClusterHarness.wait_for``: a handshake shows ``expected``."""

    async def check() -> bool:
        return await asyncio.to_thread(_handshake, address, context) == expected

    return check


@pytest.fixture
async def node(etcd_endpoints: list[str], tmp_path: Path) -> AsyncIterator[tuple[ClusterHarness, TlsFiles]]:
    certs = make_cluster_certificates(tmp_path / "ca", ["n0", "client"])
    files = certs["n0"]
    # The node's own copies, as a PKI agent would keep them.
    own = TlsFiles(tmp_path / "n0.pem", tmp_path / "n0-key.pem", tmp_path / "ca-bundle.pem")
    for src, dst in zip((files.cert, files.key, files.ca), (own.cert, own.key, own.ca), strict=True):
        dst.write_bytes(src.read_bytes())
    args = ["--tls-cert", str(own.cert), "--tls-key", str(own.key), "--tls-ca", str(own.ca)]
    h = ClusterHarness(etcd_endpoints, tmp_path / "cluster", unique_prefix("tlsreload") + "/")
    h.root.mkdir()
    try:
        await h.start(nodes=1, managers=0, node_args=args, client_tls=_context(certs["client"], files.ca))
        yield h, own
    finally:
        await h.close()


async def test_a_node_serves_a_renewed_certificate_and_a_new_ca_without_a_restart(
    node: tuple[ClusterHarness, TlsFiles], tmp_path: Path
) -> None:
    h, own = node
    n0 = h.nodes["n0"]
    assert n0.process is not None
    pid, address = n0.process.pid, h.addresses["n0"]
    ca = tmp_path / "ca"
    client = _context(TlsFiles(ca / "client.pem", ca / "client-key.pem", ca / "ca.pem"), ca / "ca.pem")
    first = x509.load_pem_x509_certificate(own.cert.read_bytes()).public_bytes(serialization.Encoding.DER)
    assert await asyncio.to_thread(_handshake, address, client) == first

    # Half a renewal (the new certificate, the old key): not loaded, the old pair served on.
    cert_pem, key_pem = _renewed(ca, "n0", tmp_path)
    replace_file(own.cert, cert_pem)
    n0.signal(signal.SIGHUP)
    await h.wait_for(
        "the half renewal refused", lambda: _logged(n0, "not loaded (still serving the previous ones)")
    )
    assert await asyncio.to_thread(_handshake, address, client) == first
    # The key follows: the renewed pair is served, by the same process.
    replace_file(own.key, key_pem)
    n0.signal(signal.SIGHUP)
    renewed = x509.load_pem_x509_certificate(cert_pem).public_bytes(serialization.Encoding.DER)
    await h.wait_for("the renewed certificate", _serves(address, client, renewed), timeout=10)

    # A client whose certificate another CA signed is refused ... until that CA joins the file.
    other = make_cluster_certificates(tmp_path / "other-ca", ["newcomer"], ca_name="Next CA")["newcomer"]
    newcomer = _context(other, ca / "ca.pem")  # it trusts the node's CA; the node does not trust its
    assert await asyncio.to_thread(_handshake, address, newcomer) is None
    replace_file(own.ca, (ca / "ca.pem").read_bytes() + other.ca.read_bytes())
    n0.signal(signal.SIGHUP)
    await h.wait_for("the new CA trusted", _serves(address, newcomer, renewed), timeout=10)
    assert await asyncio.to_thread(_handshake, address, client) == renewed  # the first CA still trusted

    assert n0.process.pid == pid and n0.running
    await h.wait_registered(["n0"])
    assert n0.log_path.read_text().count("TLS certificate reloaded from") == 2


async def test_a_ca_rotation_restarts_no_gateway_and_each_node_once(
    etcd_endpoints: list[str], tmp_path: Path
) -> None:
    """The whole rotation, from CA 1 to CA 2, on a node and a gateway's store connections
    (``ClusterBackend``, ``ReloadsTls``): the new CA beside the old everywhere, then the new
    certificates, each loaded where it is; then the node restarted with the new CA alone. The
    gateway, never restarted, still sends: it presents the certificate CA 2 signed."""
    old = make_cluster_certificates(tmp_path / "ca1", ["n0", "gateway"])
    new = make_cluster_certificates(tmp_path / "ca2", ["n0", "gateway"], ca_name="Next CA")
    files = {name: _own_copies(old[name], tmp_path / name) for name in ("n0", "gateway")}
    node_args = ["--tls-cert", str(files["n0"].cert), "--tls-key", str(files["n0"].key)]
    node_args += ["--tls-ca", str(files["n0"].ca)]
    h = ClusterHarness(etcd_endpoints, tmp_path / "cluster", unique_prefix("rotate") + "/")
    h.root.mkdir()
    backend = None
    try:
        await h.start(
            nodes=1, managers=1, node_args=node_args, client_tls=_context(old["gateway"], old["n0"].ca)
        )
        gw = files["gateway"]
        url = (
            f"cluster://{','.join(h.endpoints)}{h.prefix}?tls_cert={gw.cert}&tls_key={gw.key}&tls_ca={gw.ca}"
        )
        backend = open_cluster_backend(f"{url}&node_timeout_s={scaled(5)}", StoreOptions())
        await backend.start()
        await backend.create_queue(TenantId(T), QueueName(Q), {"replication_factor": 1, "partitions": 1})
        await h.serving_leader(await h.partition_of(T, Q))
        assert isinstance(
            (await backend.send(TenantId(T), QueueName(Q), [NewMessage(b"ca 1")]))[0], SendResult
        )
        n0 = h.nodes["n0"]
        both = old["n0"].ca.read_bytes() + new["n0"].ca.read_bytes()
        # 1. The new CA beside the old, everywhere.
        for name in ("n0", "gateway"):
            replace_file(files[name].ca, both)
        n0.signal(signal.SIGHUP)
        assert backend.reload_tls()
        # 2. Certificates the new CA signed.
        for name in ("n0", "gateway"):
            replace_file(files[name].key, new[name].key.read_bytes())
            replace_file(files[name].cert, new[name].cert.read_bytes())
        n0.signal(signal.SIGHUP)
        assert backend.reload_tls()
        # 3. The old CA gone: the node's next start trusts the new one alone.
        replace_file(files["n0"].ca, new["n0"].ca.read_bytes())
        n0.stop()
        n0.start()
        await h.wait_registered(["n0"])
        refused = _context(old["gateway"], new["n0"].ca)  # the gateway's old certificate
        assert await asyncio.to_thread(_handshake, h.addresses["n0"], refused) is None
        sent = await h.wait_for("a send by the gateway that never restarted", lambda: _send(backend, b"ca 2"))
        assert isinstance(sent, SendResult)
        got = await backend.receive(TenantId(T), QueueName(Q), 10)
        assert sorted(m.body for m in got) == [b"ca 1", b"ca 2"]
    finally:
        if backend is not None:
            await backend.close()
        await h.close()


def _own_copies(files: TlsFiles, directory: Path) -> TlsFiles:
    """A member's own copies of its files, which a rotation replaces."""
    directory.mkdir()
    own = TlsFiles(directory / "cert.pem", directory / "key.pem", directory / "ca.pem")
    for src, dst in zip((files.cert, files.key, files.ca), (own.cert, own.key, own.ca), strict=True):
        dst.write_bytes(src.read_bytes())
    return own


async def _send(backend: ClusterBackend, body: bytes) -> SendResult | None:
    try:
        [result] = await backend.send(TenantId(T), QueueName(Q), [NewMessage(body)])
    except Unavailable:
        return None  # the node is back, its partition not yet led
    return result if isinstance(result, SendResult) else None


async def _logged(proc: ClusterProcess, text: str) -> bool:
    return text in proc.log_path.read_text()
