"""A renewed TLS certificate, served without a restart.

Certificates renew every few weeks (Let's Encrypt's last 90 days and are renewed at 60), and
until now the gateway read its pair once: a renewal needed a restart, which closes every
WebSocket (1001) and makes every client reconnect, and a forgotten restart let the old
certificate expire under the clients. As NATS (``--signal reload``) and nginx (``-s reload``)
do, the gateway loads the new pair into its live ``SSLContext``: new handshakes get it,
connections already open keep theirs.

The files are looked at every ``tls_reload_interval_s`` (default 10 s; a stat of each, nothing
read while they do not change) and at once on SIGHUP (``systemctl reload``). A pair is loaded
only whole and matching: both files are copied together, checked in a scratch context, and
loaded from the same copies, so a renewal caught half-written (the certificate new, the key
not yet) keeps the old pair until the next look, with a warning. Loading into the live
context straight from the paths would not: OpenSSL replaces the certificate first and then
fails on the key, leaving a pair that matches nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import tempfile
from pathlib import Path

from cryptography import x509

log = logging.getLogger("pushgate.gateway.tls")

_Fingerprint = tuple[tuple[int, int, int], ...]


class CertificateReloader:
    """Keeps ``context`` serving the pair at ``cert`` and ``key`` (call on the event loop);
    ``not_after`` and ``loaded`` are for /metrics."""

    def __init__(self, context: ssl.SSLContext, cert: Path, key: Path, interval_s: float) -> None:
        self._context = context
        self._cert, self._key = cert, key
        self._interval_s = interval_s
        self._seen = self._fingerprint()  # the pair the server started with
        self.not_after = _leaf(cert.read_bytes()).not_valid_after_utc.timestamp()
        self.loaded = 0  # pairs loaded since start

    def check(self) -> bool:
        """Load the pair if its files changed since the last look; whether a new one was loaded."""
        seen = self._fingerprint()
        if seen == self._seen:
            return False
        try:
            leaf = self._load()
        except (OSError, ssl.SSLError, ValueError) as exc:
            # Most likely caught half-way through a renewal: the next look tries again.
            log.warning(
                "TLS certificate %s and key %s not loaded (still serving the previous pair): %s",
                self._cert,
                self._key,
                exc,
            )
            return False
        self._seen = seen
        self.loaded += 1
        self.not_after = leaf.not_valid_after_utc.timestamp()
        log.info(
            "TLS certificate reloaded from %s: %s, valid until %s",
            self._cert,
            leaf.subject.rfc4514_string(),
            leaf.not_valid_after_utc.isoformat(),
        )
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                self.check()
            except Exception:
                log.exception("checking the TLS certificate failed")

    def _fingerprint(self) -> _Fingerprint:
        try:
            stats = [os.stat(path) for path in (self._cert, self._key)]  # symlinks followed
        except OSError:
            return ()  # missing for now (a renewal replacing files): changed, and not loadable
        return tuple((s.st_ino, s.st_size, s.st_mtime_ns) for s in stats)

    def _load(self) -> x509.Certificate:
        """Load both files as one snapshot; its leaf certificate."""
        cert_pem, key_pem = self._cert.read_bytes(), self._key.read_bytes()
        leaf = _leaf(cert_pem)
        with tempfile.TemporaryDirectory(prefix="pushgate-tls-") as scratch:  # mode 0700
            cert_copy, key_copy = Path(scratch) / "cert.pem", Path(scratch) / "key.pem"
            cert_copy.write_bytes(cert_pem)
            key_copy.touch(mode=0o600)
            key_copy.write_bytes(key_pem)
            # Raises unless the two are a pair; the live context is touched only then.
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_copy, key_copy)
            self._context.load_cert_chain(cert_copy, key_copy)
        return leaf


def _leaf(pem: bytes) -> x509.Certificate:
    """The first certificate of a PEM chain (the server's own)."""
    return x509.load_pem_x509_certificate(pem)
