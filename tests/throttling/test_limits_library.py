"""What Pushgate takes from the ``limits`` library, through its public API only (docs/throttling.md).

``limits`` parses the rate notation (``parse_many`` and the items' documented fields) and
serves the ``moving-window`` strategy (its async storages and ``MovingWindowRateLimiter``).
No private name of ``limits`` is used anywhere; these tests pin the public behaviour we
rely on, so a release that changes it fails here, by name, rather than in a gateway.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from limits import RateLimitItemPerHour, RateLimitItemPerSecond, parse_many

from throttling import Rule, SharedState, parse_rate
from throttling.rates import RateWindow

PACKAGE = Path(__file__).resolve().parents[2] / "throttling"


def test_the_notation_parses_to_items_with_the_documented_fields() -> None:
    items = parse_many("10 per second; 5/2 minutes;1000/day")
    assert [(i.amount, i.multiples, i.GRANULARITY.name, i.get_expiry()) for i in items] == [
        (10, 1, "second", 1),
        (5, 2, "minute", 120),
        (1000, 1, "day", 86400),
    ]
    assert isinstance(items[0], RateLimitItemPerSecond)
    with pytest.raises(ValueError):
        parse_many("fast")


def test_a_rate_keeps_each_window_as_numbers() -> None:
    rate = parse_rate("100/second;5000/hour")
    assert rate.text == "100/second;5000/hour"
    assert rate.windows == (RateWindow(100, 1), RateWindow(5000, 3600))
    assert rate.items == (RateLimitItemPerSecond(100), RateLimitItemPerHour(5000))


# Every name the package imports from limits, each listed in docs/throttling.md.
PUBLIC_NAMES = {
    ("limits", "RateLimitItem"),
    ("limits", "parse_many"),
    ("limits.aio.storage", "MemoryStorage"),
    ("limits.aio.storage", "RedisStorage"),
    ("limits.aio.storage", "Storage"),
    ("limits.aio.strategies", "MovingWindowRateLimiter"),
    ("limits.errors", "StorageError"),
}


def test_the_package_imports_only_the_listed_public_names_of_limits() -> None:
    imported: set[tuple[str, str]] = set()
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("limits") for a in node.names), f"{path}: import limits..."
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "limits":
                imported |= {(node.module or "", alias.name) for alias in node.names}
    assert imported == PUBLIC_NAMES
    docs = (PACKAGE.parent / "docs" / "throttling.md").read_text()
    for module, name in PUBLIC_NAMES:
        assert not name.startswith("_") and "._" not in module
        assert f"{module}.{name}" in docs, f"docs/throttling.md does not list {module}.{name}"
    # And each is part of the installed version's public API.
    for module, name in PUBLIC_NAMES:
        assert hasattr(importlib.import_module(module), name)


async def test_the_moving_window_strategy_counts_and_refuses(state_url: str, unique: str) -> None:
    state = SharedState(state_url, strategy="moving-window")
    await state.start()
    try:
        r = Rule("tenant-send", parse_rate("3/hour"), (unique,))
        decisions = [await state.limiter.check([r]) for _ in range(4)]
        assert [d.allowed for d in decisions] == [True, True, True, False]
        assert [d.windows[0].remaining for d in decisions] == [2, 1, 0, 0]
        assert all(1 <= d.windows[0].reset_s <= 3600 for d in decisions)
        assert 1 <= decisions[3].retry_after_s <= 3600
        await state.limiter.clear(r)
        assert (await state.limiter.check([r])).allowed
    finally:
        await state.close()
