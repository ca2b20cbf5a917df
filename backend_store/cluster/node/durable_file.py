"""Small files a node keeps in its data directory, written so a crash leaves the old or the new."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from ...durable import fsync_directory
from ...private_files import open_private, private_dir


def write_durably(path: Path, data: bytes) -> None:
    """Write ``path`` as a new file, fsynced, renamed into place, its directory fsynced."""
    private_dir(path.parent)
    staged = path.with_name(path.name + ".new")
    with os.fdopen(open_private(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    staged.replace(path)
    fsync_directory(path.parent)


def numbered_files(root: Path) -> Iterator[tuple[int, Path]]:
    """Each file ``root/<id>`` with its id (none if ``root`` is missing); a write's leftover
    ``<id>.new`` is passed over."""
    if not root.is_dir():
        return
    for path in root.iterdir():
        if path.name.isdigit():
            yield int(path.name), path
