"""First start on an empty store: a default tenant, an admin key, a 0600 key file, once."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from backend_store import StoreOptions, open_backend
from backend_store.backend import Backend
from gateway.auth.api_keys import ApiKeyStore
from gateway.auth.authenticator import Authenticator
from gateway.auth.bootstrap import KEY_FILE_NAME, ensure_bootstrap, write_secret_file
from gateway.auth.tenants import TenantStore


async def test_bootstrap_creates_an_admin_key_once(backend: Backend, data_dir: Path) -> None:
    token = await ensure_bootstrap(backend, data_dir)
    assert token is not None
    key_file = data_dir / KEY_FILE_NAME
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert key_file.read_text() == token + "\n"
    principal = await Authenticator(backend).authenticate(token)
    assert principal.tenant == "default"
    assert principal.can("admin")
    assert await ensure_bootstrap(backend, data_dir) is None
    assert key_file.read_text() == token + "\n"
    assert len(await ApiKeyStore(backend).list_for_tenant("default")) == 1


async def test_bootstrap_survives_a_restart(data_dir: Path) -> None:
    url = "lmdb://" + str(data_dir)
    first = open_backend(url, StoreOptions(sweep_interval_s=0))
    await first.start()
    try:
        assert await ensure_bootstrap(first, data_dir) is not None
    finally:
        await first.close()
    second = open_backend(url, StoreOptions(sweep_interval_s=0))
    await second.start()
    try:
        assert await ensure_bootstrap(second, data_dir) is None
    finally:
        await second.close()


async def test_no_bootstrap_on_a_store_set_up_by_admin(backend: Backend, data_dir: Path) -> None:
    await TenantStore(backend).create("acme")
    assert await ensure_bootstrap(backend, data_dir) is None
    assert not (data_dir / KEY_FILE_NAME).exists()
    assert [t.name for t in await TenantStore(backend).list_all()] == ["acme"]


def test_secret_file_is_born_private_and_replaces_an_old_one(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("old")
    os.chmod(path, 0o644)
    old_umask = os.umask(0)  # even with a permissive umask
    try:
        write_secret_file(path, "new\n")
    finally:
        os.umask(old_umask)
    assert path.read_text() == "new\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["secret"]


def test_gateways_starting_together_agree_on_the_console_secret(tmp_path: Path) -> None:
    # Separate processes (as gateways on one data directory are), started at once: one
    # secret wins and every process signs console sessions with it.
    code = "import sys; from pathlib import Path; from gateway.operations import console_secret; "
    code += "print(console_secret(Path(sys.argv[1])).decode())"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        for _ in range(6)
    ]
    secrets = {proc.communicate(timeout=60)[0].strip() for proc in procs}
    assert all(proc.returncode == 0 for proc in procs)
    assert secrets == {(tmp_path / "console-secret").read_text().strip()}
    assert [p.name for p in tmp_path.iterdir()] == ["console-secret"]  # no temp files left
