"""The throttling suite runs every test on both shared-state backends: ``memory://`` and a real Redis."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from throttling import SharedState


@pytest.fixture(params=["memory", "redis"])
def state_url(request: pytest.FixtureRequest) -> str:
    if request.param == "memory":
        return "memory://"
    url: str = request.getfixturevalue("redis_url")
    return url


@pytest.fixture
async def state(state_url: str) -> AsyncIterator[SharedState]:
    shared = SharedState(state_url)
    await shared.start()
    try:
        yield shared
    finally:
        await shared.close()


@pytest.fixture
def unique() -> str:
    """A name no other test (or earlier run on the shared Redis) uses."""
    return uuid.uuid4().hex[:12]
