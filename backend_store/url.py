"""Open a backend by URL, the way ``limits`` picks its storage.

``lmdb:///abs/path`` or ``lmdb://relative/path``: the embedded store (default).
Implementations are imported lazily so the gateway only loads what it uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from .backend import Backend
from .encryption import Keyring
from .errors import ConfigurationError


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """Knobs shared by backends; each takes what applies to it."""

    keyring: Keyring | None = None
    map_size: int = 256 * 1024 * 1024
    max_map_size: int = 64 * 1024**3
    sweep_interval_s: float = 5.0
    # Replication log: keep at least this many recent batches (followers catch up from
    # them); 0 writes no log (a standalone store, see lmdb_store/replication_log.py).
    replication_log_keep: int = 0
    clock: Callable[[], float] | None = None
    extra: dict[str, str] = field(default_factory=dict)


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
    raise ConfigurationError(f"unknown store URL scheme {scheme!r}; expected lmdb://")
