"""Fixtures every test folder may use. Keep this small: folder-specific fixtures live in
that folder's own ``conftest.py``.

Time: tests never sleep to make time pass. Backends take ``StoreOptions.clock``; give
them a :class:`ManualClock` and move it forward. Real waits (a writer thread, a child
process) poll with a deadline from :func:`scaled`, which ``PUSHGATE_TEST_TIMEOUT_SCALE``
stretches on slow machines.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest

# A test process holds gRPC channels (etcd clients) while PySpark forks its Java gateway from
# it (subprocess with a preexec_fn): gRPC's fork handlers then broke the child now and then
# ("Java gateway process exited", every Spark test of the run in error). Nothing here forks
# to keep using gRPC in the child, so gRPC installs no fork handlers (read at its import).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# A run started in the background of a non-interactive shell (``./scripts/test &``) begins
# with SIGINT ignored, and an ignored signal stays ignored in every child: the servers tests
# start then ran their Ctrl-C drain (uvicorn catches SIGINT itself) but exited 0, not 130,
# as SIGINT was no signal to die of (tests/newcomer/test_cli.py). Caught again here, it is
# back to the default in each child, as from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Shared session fixtures, one file per external program (tests/fixtures/).
pytest_plugins = [
    "tests.fixtures.chromium",
    "tests.fixtures.redis_server",
    "tests.fixtures.etcd_server",
    "tests.fixtures.dev_cluster",
    "tests.fixtures.inprocess_cluster",
    "tests.fixtures.spark",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Groups for ``pytest -n N --dist loadgroup`` (scripts/test): a file's tests run in one
    worker, so its module fixtures start once; every Spark test runs in one worker, so the
    run starts one SparkSession (about 10 s and 1 GB each). Without xdist the marks do nothing."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        group = "spark" if "spark" in fixtures else item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))


# A fixed, recognisable epoch (2023-11-14T22:13:20Z): a store time that comes from the
# wall clock instead of the injected one stands out in a failure message.
CLOCK_START = 1_700_000_000.0


def scaled(seconds: float) -> float:
    """A timeout stretched by ``PUSHGATE_TEST_TIMEOUT_SCALE`` (default 1)."""
    return seconds * float(os.environ.get("PUSHGATE_TEST_TIMEOUT_SCALE", "1"))


class ManualClock:
    """A clock that moves only when told to; pass it as ``StoreOptions.clock``.

    ``publish_to`` hands every reading to another place as well (the contract suite's
    in-process cluster holds its nodes' clock at it: tests/fixtures/inprocess_cluster.py)."""

    def __init__(self, start: float = CLOCK_START) -> None:
        self._now = start
        self._sinks: list[Callable[[float], None]] = []

    @property
    def now(self) -> float:
        return self._now

    @now.setter
    def now(self, value: float) -> None:
        self._now = value
        for sink in self._sinks:
            sink(value)

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now

    @contextlib.contextmanager
    def publish_to(self, sink: Callable[[float], None]) -> Iterator[None]:
        """While inside: ``sink`` gets the time now and after every move."""
        sink(self._now)
        self._sinks.append(sink)
        try:
            yield
        finally:
            self._sinks.remove(sink)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


async def wait_for(
    predicate: Callable[[], Awaitable[bool]], timeout: float = 5.0, what: str = "condition"
) -> None:
    """Poll an async predicate until it holds; fail after a (scaled) deadline.

    For effects of background work (the sweeper, a writer thread) that no event announces.
    The poll interval is short so a passing test costs milliseconds, not a fixed sleep.
    """
    deadline = time.monotonic() + scaled(timeout)
    while not await predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {scaled(timeout):g}s waiting for {what}")
        await asyncio.sleep(0.01)
