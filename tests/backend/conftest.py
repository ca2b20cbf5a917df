"""Backend fixtures: every test using them runs against each backend kind in ``STORE_KINDS``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backend_store import Backend

from ..conftest import ManualClock
from .harness import STORE_KINDS, StoreFactory, kinds_for


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Each test runs on every kind it can (harness.kinds_for says why some cannot).
    if "store_factory" in metafunc.fixturenames:
        metafunc.parametrize("store_factory", kinds_for(metafunc.function), indirect=True)


@pytest.fixture
async def store_factory(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[StoreFactory]:
    kind: str = request.param
    async with STORE_KINDS[kind].open(request, tmp_path) as url:
        factory = StoreFactory(kind=kind, url=url, clock=clock)
        try:
            yield factory
        finally:
            await factory.close_all()


@pytest.fixture
async def store(store_factory: StoreFactory) -> Backend:
    return await store_factory.open()
