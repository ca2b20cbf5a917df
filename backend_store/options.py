"""Options every backend is built with, whatever its URL (each takes what applies to it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .encryption import Keyring


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
