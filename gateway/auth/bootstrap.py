"""First start: a ``default`` tenant and an admin key, so a fresh gateway is usable at once."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from backend_store.backend import MetadataStore
from backend_store.private_files import private_dir

from . import tenants
from .api_keys import ApiKeyStore
from .tenants import TenantStore

BOOTSTRAP_TENANT = "default"
KEY_FILE_NAME = "bootstrap-admin-key"
_STATE_NAMESPACE = "gateway"
_DONE_KEY = "bootstrapped"


async def ensure_bootstrap(backend: MetadataStore, data_dir: Path) -> str | None:
    """On a store with no tenants, create tenant ``default`` and an ``admin`` key.

    The key is written to ``data_dir/bootstrap-admin-key`` (mode 0600, replacing an
    older file) and returned so that ``pushgate serve`` prints it once. Later calls,
    and calls on a store someone already set up with ``pushgate admin``, return None.
    """
    if await backend.meta_get(_STATE_NAMESPACE, _DONE_KEY) is not None:
        return None
    if await backend.meta_list(tenants.NAMESPACE):
        await _mark_done(backend)
        return None
    tenant_store = TenantStore(backend)
    if await tenant_store.get(BOOTSTRAP_TENANT) is None:
        await tenant_store.create(BOOTSTRAP_TENANT)
    _, token = await ApiKeyStore(backend).create(BOOTSTRAP_TENANT, "admin")
    write_secret_file(data_dir / KEY_FILE_NAME, token + "\n")
    await _mark_done(backend)
    return token


async def _mark_done(backend: MetadataStore) -> None:
    await backend.meta_put(_STATE_NAMESPACE, _DONE_KEY, b"1", only_if_absent=True)


def write_secret_file(path: Path, text: str, *, exclusive: bool = False) -> None:
    """Write ``text`` to ``path`` readable only by its owner, atomically.

    The file is born 0600 (``O_CREAT | O_EXCL``, never chmod-ed after the secret is in
    it), then renamed over ``path``, so no reader ever sees it partial or too open.
    ``exclusive``: only if ``path`` does not exist (hard-linked into place, so of two
    processes racing exactly one wins); the loser gets FileExistsError.
    """
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # left by a crash of an earlier process with the same pid
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        if exclusive:
            os.link(tmp, path)
            tmp.unlink()
        else:
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
