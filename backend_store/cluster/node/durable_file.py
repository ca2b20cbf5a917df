"""Small files a node keeps in its data directory, written so a crash leaves the old or the new."""

from __future__ import annotations

import os
from pathlib import Path


def write_durably(path: Path, data: bytes) -> None:
    """Write ``path`` as a new file, fsynced, renamed into place, its directory fsynced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(path.name + ".new")
    with staged.open("wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    staged.replace(path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
