"""Backend fixtures: every test here runs against each backend kind in ``URL_BUILDERS``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backend_store import Backend

from ..conftest import ManualClock
from .harness import URL_BUILDERS, StoreFactory


@pytest.fixture(params=sorted(URL_BUILDERS))
async def store_factory(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[StoreFactory]:
    kind: str = request.param
    factory = StoreFactory(kind=kind, url=URL_BUILDERS[kind](tmp_path), clock=clock)
    try:
        yield factory
    finally:
        await factory.close_all()


@pytest.fixture
async def store(store_factory: StoreFactory) -> Backend:
    return await store_factory.open()
