"""Auth fixtures: a real embedded store in a temporary directory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backend_store import StoreOptions, open_backend
from backend_store.backend import Backend
from gateway.auth.authenticator import Authenticator
from tests.conftest import ManualClock


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture
async def backend(data_dir: Path) -> AsyncIterator[Backend]:
    store = open_backend("lmdb://" + str(data_dir), StoreOptions(sweep_interval_s=0))
    await store.start()
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
def cache_clock() -> ManualClock:
    """Drives the authenticator's cache expiry (not token times, which use the wall clock)."""
    return ManualClock()


@pytest.fixture
def auth(backend: Backend, cache_clock: ManualClock) -> Authenticator:
    return Authenticator(backend, cache_ttl_s=5.0, clock=cache_clock)
