"""A real gateway for the client's tests (the push tests' fixture, with its small settings)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import pytest

from pushgate_client import Message
from tests.gateway.conftest import RunningGateway
from tests.push.conftest import engine_of, start_push_gateway

__all__ = ["RunningGateway", "engine_of", "text"]
_names = itertools.count()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    running = start_push_gateway(tmp_path_factory.mktemp("client"))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def qname() -> str:
    return f"cq{next(_names)}-{time.monotonic_ns() % 10**9}"


def text(message: Message) -> str:
    """A text message's body; fails on a binary one (``body`` None)."""
    assert message.body is not None, f"message {message.id} is binary"
    return message.body
