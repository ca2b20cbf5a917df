"""What every writer of files that must survive a crash needs: a directory's entries synced."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_directory(path: Path) -> None:
    """Sync ``path``'s entries (a rename or a new file in it reaches the disk)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
