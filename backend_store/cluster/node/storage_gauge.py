"""Measuring a node's storage use (:class:`NodeStorage`, published in its etcd record).

:class:`StorageGauge` measures at most every ``every_s`` seconds (the figures move slowly,
and each new figure is one more etcd write and a map rebuild on every gateway), off the event
loop, skipping an environment closed under it (its partition left the node meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterable
from pathlib import Path

from ...backend import StorageStats
from ...errors import PushgateError
from ...types import StorageUsage
from ..coordination.storage_record import NodeStorage, summarise


def _disk(path: Path) -> tuple[int, int]:
    """(free for this user, total) bytes of the file system holding ``path`` (or, before the
    node made it, its nearest existing parent)."""
    while not path.exists() and path.parent != path:
        path = path.parent
    fs = os.statvfs(path)
    return fs.f_bavail * fs.f_frsize, fs.f_blocks * fs.f_frsize


class StorageGauge:
    """The node's :class:`NodeStorage`, measured at most every ``every_s`` seconds."""

    def __init__(self, data_dir: Path, *, every_s: float = 2.0) -> None:
        self.data_dir = data_dir
        self.every_s = every_s
        self._last: NodeStorage | None = None
        self._measured = -float("inf")  # monotonic

    async def current(self, stores: Iterable[object]) -> NodeStorage | None:
        """The last measurement, or a new one if it is older than ``every_s``. ``stores``
        are the node's partition stores (those without storage figures are skipped)."""
        if time.monotonic() - self._measured < self.every_s:
            return self._last
        self._measured = time.monotonic()
        usages: list[StorageUsage] = []
        for store in list(stores):
            if isinstance(store, StorageStats):
                # Closed meanwhile (the partition left the node): it holds nothing any more.
                with contextlib.suppress(PushgateError):
                    usages.append(await store.storage_usage())
        try:
            free, total = await asyncio.to_thread(_disk, self.data_dir)
        except OSError:
            free = total = 0
        self._last = summarise(usages, free, total)
        return self._last
