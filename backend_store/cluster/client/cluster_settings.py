"""The gateway side's settings: ``cluster://etcd-host:port[,...][/root/]?name=value`` parsed
into :class:`ClusterSettings` (docs/cluster.md lists the options)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from ...errors import ConfigurationError
from ..coordination.etcd_tls import EtcdTls
from ..coordination.layout import DEFAULT_PREFIX
from ..protocol.tls import TlsFiles
from .send_batcher import DEFAULT_LINGER_S


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """Knobs of the gateway side, from ``cluster://...?name=value`` (or defaults)."""

    root: str = DEFAULT_PREFIX
    # A request's whole budget, retries and waits for a leader included.
    request_deadline_s: float = 10.0
    # One attempt at one node (a sync send waits for a majority fsync within it).
    node_timeout_s: float = 5.0
    # How long ``create_queue`` waits for the manager to place the new queue's partitions.
    placement_wait_s: float = 10.0
    reread_every_s: float = 5.0
    etcd_timeout_s: float = 2.0
    # The replication factor of a queue created without one (docs/api.md's default is 1).
    replication_factor: int = 1
    # Mutual TLS to the nodes (all three PEM paths, or none): tls.py.
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    # TLS to etcd (etcd_tls.py): the CA that signed etcd's certificate; a client certificate
    # and key (together) for an etcd that asks for one.
    etcd_ca: str = ""
    etcd_cert: str = ""
    etcd_key: str = ""
    # 1: sends to a partition wait while one is in flight and go together (send_batcher.py).
    send_batching: int = 1
    # Seconds a send that finds its partition's lane free but busy waits for others
    # (send_batcher.py, DEFAULT_LINGER_S; 0: never).
    send_linger_s: float = DEFAULT_LINGER_S

    def tls_files(self) -> TlsFiles | None:
        return TlsFiles.from_options(
            self.tls_cert, self.tls_key, self.tls_ca, names="tls_cert, tls_key and tls_ca"
        )

    def etcd_tls(self) -> EtcdTls | None:
        return EtcdTls.from_options(
            self.etcd_ca, self.etcd_cert, self.etcd_key, names="etcd_ca, etcd_cert and etcd_key"
        )


def parse_cluster_url(url: str) -> tuple[str, ClusterSettings]:
    """``cluster://h:p,h:p/root/?request_deadline_s=5`` as (endpoints, settings)."""
    parts = urlsplit(url)
    if parts.scheme != "cluster":
        raise ConfigurationError(f"not a cluster URL: {url!r}")
    if not parts.netloc:
        raise ConfigurationError("cluster URL needs etcd endpoints, e.g. cluster://127.0.0.1:2379")
    root = parts.path if parts.path not in ("", "/") else DEFAULT_PREFIX
    root = root if root.endswith("/") else root + "/"
    values: dict[str, Any] = {"root": root}
    known = ClusterSettings.__dataclass_fields__
    for item in filter(None, parts.query.split("&")):
        name, _, raw = item.partition("=")
        if name not in known or name == "root":
            raise ConfigurationError(f"unknown cluster URL option {name!r}")
        if name.startswith(("tls_", "etcd_")) and name != "etcd_timeout_s":
            values[name] = unquote(raw)  # a path
            continue
        try:
            values[name] = int(raw) if name in ("replication_factor", "send_batching") else float(raw)
        except ValueError:
            raise ConfigurationError(f"cluster URL option {name} must be a number") from None
    settings = ClusterSettings(**values)
    # Said now rather than at the first dial: TLS options that do not go together.
    settings.tls_files()
    settings.etcd_tls()
    return parts.netloc, settings
