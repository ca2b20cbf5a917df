"""Mutual TLS on the node protocol (docs/cluster.md, "TLS on the node protocol").

Every node-protocol connection (a gateway's :class:`~.client.NodeClient`, a leader's
replication link, a node's listening port) can run over TLS with certificates signed by the
cluster's own CA:

- the **server side** (a node's port) requires a client certificate signed by the CA
  (``CERT_REQUIRED``), so nobody without one gets a single frame answered;
- the **client side** (gateways, leaders dialling followers) verifies the node's certificate
  against the same CA and presents its own.

No hostname check: nodes advertise ``HOST:PORT``, mostly IPs, and move; the trust anchor is
a CA that signs cluster members only (never a public CA bundle). Any certificate it signed is
a member, as with etcd's peer TLS on a private CA. TLS 1.2 is the minimum.

:func:`serve_node_protocol` starts a node's listener. With TLS it accepts TCP, then runs the
handshake itself, so a refused peer (no certificate, another CA, plaintext) is logged once
with its address at warning, not silently dropped by asyncio (which logs a failed server
handshake only in debug mode) and not with a traceback per attempt.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from ...errors import ConfigurationError
from ...tls_reload import Apply, leaf_certificate

log = logging.getLogger("pushgate.cluster")

# A peer that connects and sends no ClientHello is dropped after this long.
HANDSHAKE_TIMEOUT_S = 10.0
# A peer refused again within this long is counted, not logged again.
REFUSAL_LOG_EVERY_S = 60.0

ConnectionHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files: this process's certificate (chain) and key, and the cluster's CA."""

    cert: Path
    key: Path
    ca: Path

    @classmethod
    def from_options(
        cls, cert: str | Path | None, key: str | Path | None, ca: str | Path | None, *, names: str
    ) -> TlsFiles | None:
        """All three, or none (``None``: plaintext). ``names`` says how the caller spells the
        three options, for the error (``--tls-cert, --tls-key and --tls-ca``)."""
        given = [value for value in (cert, key, ca) if value]
        if not given:
            return None
        if len(given) != 3:
            raise ConfigurationError(f"TLS needs all of {names}, or none of them")
        assert cert and key and ca
        return cls(Path(cert), Path(key), Path(ca))


@dataclass(frozen=True, slots=True)
class NodeTls:
    """The two contexts of one process: ``server`` for a node's port, ``client`` for dialling
    nodes (both present this process's certificate and trust only the cluster's CA)."""

    server: ssl.SSLContext
    client: ssl.SSLContext

    @classmethod
    def load(cls, files: TlsFiles) -> NodeTls:
        """Build both contexts; :class:`ConfigurationError` names the file that is wrong."""
        _check_signed_by_ca(files)
        return cls(server_context(files), client_context(files))


def node_tls_loader(live: NodeTls) -> Apply:
    """Renewed files (certificate, key, CA) for a :class:`~backend_store.tls_reload.TlsReloader`:
    checked as :meth:`NodeTls.load` checks them at start, then loaded into both live contexts.

    A CA file's certificates are *added* to what the contexts trust: a context can learn a CA
    but never forget one. So a CA rotation works without restarts in its first two steps (the
    new CA beside the old on every member, then certificates the new CA signed), and its last
    (the old CA gone) takes effect at each process's next start (docs/cluster.md, section 10)."""

    def apply(copies: Sequence[Path]) -> x509.Certificate:
        cert, key, ca = copies
        NodeTls.load(TlsFiles(cert, key, ca))  # raises, naming what is wrong, before any change
        for context in (live.server, live.client):
            context.load_cert_chain(cert, key)
            context.load_verify_locations(cafile=ca)
        return leaf_certificate(cert.read_bytes())

    return apply


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """A node's listening side: a client certificate signed by the CA is required."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _configure(context, files)
    return context


def client_context(files: TlsFiles) -> ssl.SSLContext:
    """The dialling side: the node's certificate must chain to the CA; no hostname check
    (see the module's docstring)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    _configure(context, files)
    return context


def _configure(context: ssl.SSLContext, files: TlsFiles) -> None:
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_REQUIRED
    for what, path in (("certificate", files.cert), ("key", files.key), ("CA", files.ca)):
        if not path.is_file():
            raise ConfigurationError(f"TLS {what} file {path} does not exist")

    def no_passphrase() -> str:
        # Called only for an encrypted key: OpenSSL would otherwise ask on the terminal, and
        # nodes start unattended.
        raise ConfigurationError(f"TLS key {files.key} is encrypted: give the key without a passphrase")

    try:
        context.load_cert_chain(files.cert, files.key, password=no_passphrase)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
            raise ConfigurationError(
                f"TLS key {files.key} does not belong to the certificate {files.cert}"
            ) from None
        raise ConfigurationError(
            f"TLS certificate {files.cert} or key {files.key} cannot be loaded: {exc.reason or exc}"
        ) from None
    except OSError as exc:
        raise ConfigurationError(f"TLS certificate or key cannot be read: {exc}") from None
    try:
        context.load_verify_locations(cafile=files.ca)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigurationError(f"TLS CA file {files.ca} cannot be loaded: {exc}") from None


def _check_signed_by_ca(files: TlsFiles) -> None:
    """Refuse to start with a certificate the cluster's CA did not sign (every handshake with
    the other members would fail; better one clear error at start)."""
    try:
        chain = x509.load_pem_x509_certificates(files.cert.read_bytes())
        authorities = x509.load_pem_x509_certificates(files.ca.read_bytes())
    except FileNotFoundError as exc:
        raise ConfigurationError(f"TLS file {exc.filename} does not exist") from None
    except (ValueError, OSError) as exc:
        raise ConfigurationError(f"TLS certificate or CA file is not PEM certificates: {exc}") from None
    leaf, issuers = chain[0], [*chain[1:], *authorities]
    for issuer in issuers:
        try:
            leaf.verify_directly_issued_by(issuer)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return
    raise ConfigurationError(f"TLS certificate {files.cert} is not signed by the CA in {files.ca}")


# The listener -------------------------------------------------------------------------------


@dataclass
class RefusalLog:
    """Warns once per peer host and reason about refused handshakes, then at most every
    ``every_s`` with a count (a leader re-dialling every 0.1 s must not flood the log)."""

    every_s: float = REFUSAL_LOG_EVERY_S
    clock: Callable[[], float] = time.monotonic
    refused: int = 0  # every refusal, logged or not
    # (host, reason) -> (logged at, refusals since)
    _last: dict[tuple[str, str], tuple[float, int]] = field(default_factory=dict)

    def refuse(self, peer: str, host: str, reason: str) -> None:
        self.refused += 1
        now = self.clock()
        key = (host, reason)
        logged_at, since = self._last.get(key, (None, 0))
        if logged_at is not None and now - logged_at < self.every_s:
            self._last[key] = (logged_at, since + 1)
            return
        more = f" ({since} more like it from {host} since the last warning)" if since else ""
        log.warning("node protocol: refused a TLS connection from %s: %s%s", peer, reason, more)
        self._last[key] = (now, 0)


async def serve_node_protocol(
    handle: ConnectionHandler,
    host: str,
    port: int,
    context: ssl.SSLContext | None,
    refusals: RefusalLog | None = None,
) -> asyncio.Server:
    """``asyncio.start_server(handle, host, port)``; with ``context``, TLS only: ``handle``
    sees a connection only after a handshake that verified the peer's certificate."""
    if context is None:
        return await asyncio.start_server(handle, host, port)
    refused = refusals if refusals is not None else RefusalLog()
    loop = asyncio.get_running_loop()

    async def handshake_first(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        peer_host = str(peername[0]) if isinstance(peername, tuple) else str(peername)
        peer = f"{peer_host}:{peername[1]}" if isinstance(peername, tuple) else peer_host
        try:
            await writer.start_tls(context, ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)
        except ssl.SSLError as exc:
            refused.refuse(peer, peer_host, _reason(exc))
            writer.transport.abort()
            return
        except (OSError, TimeoutError, EOFError) as exc:
            refused.refuse(
                peer, peer_host, f"no TLS handshake: the peer closed or stalled ({type(exc).__name__})"
            )
            writer.transport.abort()
            return
        await handle(reader, writer)

    def protocol() -> asyncio.StreamReaderProtocol:
        return _HandshakeFirst(asyncio.StreamReader(loop=loop), handshake_first, loop=loop)

    return await loop.create_server(protocol, host, port)


def _reason(exc: ssl.SSLError) -> str:
    verify = getattr(exc, "verify_message", None)  # SSLCertVerificationError: why the chain failed
    reason = exc.reason or str(exc)
    return f"{reason} ({verify})" if verify else str(reason)


class _HandshakeFirst(asyncio.StreamReaderProtocol):
    """A stream protocol that reads nothing before ``start_tls`` takes the transport over:
    the peer's ClientHello would otherwise land in the plaintext reader's buffer."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A TCP transport reads (uvloop's are not subclasses of asyncio's ReadTransport).
        # start_tls resumes it under its TLS protocol.
        cast(asyncio.ReadTransport, transport).pause_reading()
        super().connection_made(transport)

    def eof_received(self) -> bool:
        # Every byte comes through asyncio's TLS layer, which closes the transport itself (and
        # warns at a True here). The base class would answer True for a peer whose EOF
        # arrives before ``start_tls`` returned: it decides by the transport it first saw.
        super().eof_received()
        return False
