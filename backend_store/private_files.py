"""Data directories 0700, their files 0600: made so, and checked at start.

A store holds messages, API key hashes, JWT secrets and, without an encryption keyring, the
AWS secrets SigV4 needs in clear; none of it is for other local users. So every directory
the gateway and a node make for data is created 0700 and every file 0600 (LMDB's own files
through its ``mode``), whatever the umask. What was made before, or by hand, is looked at
on start: :func:`too_open` lists what any other user may read or enter, and the caller logs
a warning naming each path (it does not change them: an operator may have meant it, e.g. a
group that runs backups).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600
# Beyond this many entries a start does not look further (a node's partition directories).
MAX_CHECKED = 10_000


def private_dir(path: Path) -> Path:
    """``path`` (and missing parents) created 0700; an existing directory is left as it is."""
    if not path.is_dir():
        for missing in reversed([path, *path.parents]):
            if not missing.exists():
                with contextlib.suppress(FileExistsError):  # another process made it meanwhile
                    missing.mkdir(mode=DIR_MODE)
    return path


def open_private(path: Path, flags: int) -> int:
    """``os.open`` with mode 0600 for a file it creates."""
    return os.open(path, flags, FILE_MODE)


def _walk(root: Path, depth: int) -> Iterator[tuple[Path, os.stat_result]]:
    try:
        info = root.lstat()
    except FileNotFoundError:
        return
    yield root, info
    if depth > 0 and stat.S_ISDIR(info.st_mode):
        try:
            children = sorted(root.iterdir())
        except OSError:
            return
        for child in children:
            yield from _walk(child, depth - 1)


def too_open(root: Path, depth: int = 3) -> list[tuple[Path, int]]:
    """Directories and files under ``root`` (``depth`` levels) that others may use, with their mode."""
    found: list[tuple[Path, int]] = []
    for checked, (path, info) in enumerate(_walk(root, depth)):
        if checked >= MAX_CHECKED:
            break
        if stat.S_ISLNK(info.st_mode):
            continue
        if (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)) and info.st_mode & 0o077:
            found.append((path, stat.S_IMODE(info.st_mode)))
    return found


def warning_lines(root: Path, depth: int = 3) -> list[str]:
    """One warning per path under ``root`` wider than 0700 (directories) or 0600 (files)."""
    return [
        f"{path} is mode {mode:04o}: other local users may read it; "
        f"make it {'0700' if path.is_dir() else '0600'} (chmod {'700' if path.is_dir() else '600'} {path})"
        for path, mode in too_open(root, depth)
    ]
