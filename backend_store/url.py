"""Open a backend by URL, the way ``limits`` picks its storage.

``lmdb:///abs/path`` or ``lmdb://relative/path``: the embedded store (default).
``cluster://etcd-host:port[,host:port...][/root/]``: replicated backend nodes found
through etcd (docs/cluster.md).
Implementations are imported lazily so the gateway only loads what it uses.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from .backend import Backend
from .errors import ConfigurationError
from .options import StoreOptions


def lmdb_path(url: str) -> Path:
    parts = urlsplit(url)
    if parts.scheme != "lmdb":
        raise ConfigurationError(f"not an lmdb URL: {url!r}")
    path = parts.netloc + parts.path
    if not path:
        raise ConfigurationError("lmdb URL needs a path, e.g. lmdb:///var/lib/pushgate")
    return Path(path)


def open_backend(url: str, options: StoreOptions | None = None) -> Backend:
    """Build (not start) the backend a URL names."""
    options = options or StoreOptions()
    scheme = urlsplit(url).scheme
    if scheme == "lmdb":
        from .lmdb_store.engine import LmdbBackend

        return LmdbBackend(lmdb_path(url), options)
    if scheme == "cluster":
        from .cluster.client.cluster_backend import open_cluster_backend

        return open_cluster_backend(url, options)
    raise ConfigurationError(f"unknown store URL scheme {scheme!r}; expected lmdb:// or cluster://")
