"""Backend fixtures: every test using them runs against each backend kind in ``STORE_KINDS``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backend_store import Backend

from ..conftest import ManualClock
from .harness import STORE_KINDS, StoreFactory


@pytest.fixture(params=sorted(STORE_KINDS))
async def store_factory(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[StoreFactory]:
    kind: str = request.param
    async with STORE_KINDS[kind](tmp_path) as url:
        factory = StoreFactory(kind=kind, url=url, clock=clock)
        try:
            yield factory
        finally:
            await factory.close_all()


@pytest.fixture
async def store(store_factory: StoreFactory) -> Backend:
    return await store_factory.open()
