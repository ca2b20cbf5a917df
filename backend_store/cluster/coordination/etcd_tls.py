"""TLS to etcd, which ``aetcd`` 1.x does not offer (it dials plaintext only).

:class:`EtcdTls` names the PEM files: the CA that signed etcd's certificate, and this
process's certificate and key for an etcd that asks clients for one (``--client-cert-auth``).
:class:`TlsClient` is ``aetcd.Client`` with the one thing that differs, the channel its
``connect`` opens: ``grpc.aio.secure_channel`` instead of ``insecure_channel``.

:func:`etcd_client` chooses. Plaintext is ``aetcd.Client`` and its public ``connect`` on any
release. TLS is :class:`TlsClient`, written against aetcd's private attributes; on a release
other than the tested one it is still used, after one warning (:data:`TESTED_AETCD`): aetcd
has no public door to TLS, and falling back to plaintext would send etcd's traffic, leases
and keys in the clear where the operator asked for TLS.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aetcd
import aetcd.client
import grpc
from aetcd import rpc, watcher

from ...errors import ConfigurationError
from ...tested_versions import RELEASES, ReleaseCheck, VersionRange

# The aetcd releases TlsClient.connect was written against.
TESTED_AETCD = VersionRange(
    "aetcd",
    "1.0",
    "1.1",
    "coordination/etcd_tls.py redoes aetcd.Client.connect over TLS with its private attributes",
    "TLS to etcd still uses that connect, untested on this release (aetcd has no public TLS "
    "connect and TLS is never dropped to plaintext); a failure shows when connecting to etcd",
)


def etcd_client(
    host: str,
    port: int,
    *,
    timeout_s: float,
    options: dict[str, Any],
    tls: EtcdTls | None,
    releases: ReleaseCheck = RELEASES,
) -> aetcd.Client:
    """aetcd's client for ``host:port``: its own (public ``connect``) in plaintext, a
    :class:`TlsClient` over TLS (warned about once if aetcd is not a tested release)."""
    if tls is None:
        return aetcd.Client(host=host, port=port, timeout=timeout_s, options=options)
    releases.tested(TESTED_AETCD)
    return TlsClient(host=host, port=port, timeout=timeout_s, options=options, credentials=tls.credentials())


@dataclass(frozen=True, slots=True)
class EtcdTls:
    """The CA to trust etcd by, and this process's certificate and key (both or neither)."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None

    @classmethod
    def from_options(
        cls, ca: str | Path | None, cert: str | Path | None, key: str | Path | None, *, names: str
    ) -> EtcdTls | None:
        """``None`` when none is given (plaintext). ``names`` spells the three options, CA
        first, for the errors (``--etcd-ca, --etcd-cert and --etcd-key``)."""
        if not (ca or cert or key):
            return None
        ca_name = names.split(",")[0]
        if not ca:
            raise ConfigurationError(f"TLS to etcd needs the CA ({ca_name}) to check etcd's certificate")
        if bool(cert) != bool(key):
            raise ConfigurationError(f"TLS to etcd takes a certificate and its key together ({names})")
        return cls(Path(ca), Path(cert) if cert else None, Path(key) if key else None)

    def credentials(self) -> grpc.ChannelCredentials:
        """Read the files now: a missing or unreadable one is a configuration error at start."""
        try:
            ca = self.ca.read_bytes()
            cert = self.cert.read_bytes() if self.cert else None
            key = self.key.read_bytes() if self.key else None
        except OSError as exc:
            raise ConfigurationError(f"cannot read a TLS file for etcd: {exc}") from None
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


class TlsClient(aetcd.Client):  # type: ignore[misc]  # (aetcd has no type hints)
    """``aetcd.Client`` over TLS: its ``connect`` (aetcd 1.0) with a secure channel."""

    _is_connecting: bool  # aetcd's, set in its __init__

    def __init__(self, *args: Any, credentials: grpc.ChannelCredentials, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._credentials = credentials

    @aetcd.client._handle_errors  # type: ignore[untyped-decorator]
    async def connect(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        try:
            self._is_connecting = True
            target = f"{self._host}:{self._port}"
            self.channel = grpc.aio.secure_channel(target, self._credentials, options=self._options.items())
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = watcher.Watcher(rpc.WatchStub(self.channel), timeout=self._timeout, metadata=None)
            self._connected.set()
        finally:
            self._is_connecting = False
