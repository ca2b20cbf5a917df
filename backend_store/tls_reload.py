"""Renewed TLS certificates, served without a restart.

Certificates renew every few weeks (Let's Encrypt's last 90 days and are renewed at 60;
cluster PKIs such as cert-manager renew in days), and a process that read its files once
needed a restart for each renewal. For the gateway, that closes every WebSocket (1001); for a
node, it moves its partitions' leadership. A forgotten restart let the old certificate expire
under the clients. So a server loads a renewed pair into its live ``SSLContext``, as NATS
(``--signal reload``) and nginx (``-s reload``) do: new handshakes get it, and connections
already open keep theirs.

:class:`TlsReloader` looks at its files every ``interval_s`` (a stat of each, nothing read
while none changes) and at once when asked (SIGHUP: ``systemctl reload``). A change is loaded
only whole and valid. The files are copied together into a private directory, and the
caller's ``apply`` checks the copies in scratch contexts before it loads the same copies into
the live ones. So a renewal caught half-written (the certificate new, the key not yet) keeps the
old pair until the next look, with a warning. Loading into a live context straight from the
paths would not: OpenSSL replaces the certificate first and then fails on the key, leaving a
pair that matches nothing.

Users: the gateway's HTTPS listener (``gateway/server.py``, :func:`server_pair_loader`), and
the node protocol's mutual TLS (``cluster/protocol/tls.py``, ``node_tls_loader``) on a node and
in a gateway's ``cluster://`` backend.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from cryptography import x509

from .errors import PushgateError

log = logging.getLogger("pushgate.tls")

# How often a process looks at its TLS files when nothing says otherwise.
RELOAD_EVERY_S = 10.0
# Given copies of the watched files (same order), check them and load them into the live
# contexts, touching those only once the copies passed; return the served leaf certificate.
Apply = Callable[[Sequence[Path]], x509.Certificate]
_Fingerprint = tuple[tuple[int, int, int], ...]


class TlsReloader:
    """Keeps live contexts serving the PEM files at ``paths`` (the certificate first); call
    on the event loop. ``not_after`` and ``loaded`` are for /metrics."""

    def __init__(self, paths: Sequence[Path], apply: Apply, interval_s: float) -> None:
        self._paths = tuple(paths)
        self._apply = apply
        self._interval_s = interval_s
        self._seen = self._fingerprint()  # the files the process started with
        self.not_after = leaf_certificate(self._paths[0].read_bytes()).not_valid_after_utc.timestamp()
        self.loaded = 0  # renewals loaded since start

    def check(self) -> bool:
        """Load the files if they changed since the last look; whether they were loaded."""
        seen = self._fingerprint()
        if seen == self._seen:
            return False
        try:
            leaf = self._load()
        except (OSError, ValueError, PushgateError) as exc:
            # Unreadable, not PEM (ValueError), not a pair or not signed by the CA (ssl.SSLError
            # is an OSError; ConfigurationError from NodeTls.load): most likely a renewal caught
            # half-way. The previous set is served on, and the next look tries again.
            log.warning(
                "TLS files %s not loaded (still serving the previous ones): %s",
                ", ".join(map(str, self._paths)),
                exc,
            )
            return False
        self._seen = seen
        self.loaded += 1
        self.not_after = leaf.not_valid_after_utc.timestamp()
        log.info(
            "TLS certificate reloaded from %s: %s, valid until %s",
            self._paths[0],
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
                # A bug, not a bad file: with its traceback, and the watch goes on.
                log.exception("looking at the TLS files %s failed", ", ".join(map(str, self._paths)))

    def _fingerprint(self) -> _Fingerprint:
        try:
            stats = [os.stat(path) for path in self._paths]  # symlinks followed
        except OSError:
            return ()  # missing for now (a renewal replacing files): changed, and not loadable
        return tuple((s.st_ino, s.st_size, s.st_mtime_ns) for s in stats)

    def _load(self) -> x509.Certificate:
        contents = [path.read_bytes() for path in self._paths]
        with tempfile.TemporaryDirectory(prefix="pushgate-tls-") as scratch:  # mode 0700
            copies = [Path(scratch) / f"{i}.pem" for i in range(len(contents))]
            for copy, content in zip(copies, contents, strict=True):
                copy.touch(mode=0o600)  # a key among them
                copy.write_bytes(content)
            return self._apply(copies)


def leaf_certificate(pem: bytes) -> x509.Certificate:
    """The first certificate of a PEM chain (the server's own)."""
    return x509.load_pem_x509_certificate(pem)


def server_pair_loader(context: ssl.SSLContext) -> Apply:
    """For a TLS server context loaded from a certificate and its key (the gateway's)."""

    def apply(copies: Sequence[Path]) -> x509.Certificate:
        cert, key = copies
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)  # raises unless a pair
        context.load_cert_chain(cert, key)
        return leaf_certificate(cert.read_bytes())

    return apply
