from __future__ import annotations

import pytest

from backend_store.errors import InvalidRequest
from gateway.auth.scopes import (
    format_scopes,
    is_valid_scope,
    known_scopes,
    parse_scopes,
    pattern_within,
    scope_within,
    scopes_beyond,
)


@pytest.mark.parametrize(
    "scope",
    ["admin", "send:orders", "send:orders-*", "receive:*", "receive:a?c", "send:jobs.fifo", "receive:*.fifo"],
)
def test_valid_scopes(scope: str) -> None:
    assert is_valid_scope(scope)


@pytest.mark.parametrize(
    "scope", ["", "root", "send", "send:", "delete:q", "send:a b", "send:a/b", "receive:[ab]", "Admin"]
)
def test_invalid_scopes(scope: str) -> None:
    assert not is_valid_scope(scope)


def test_parse_scopes_splits_on_whitespace_and_accepts_lists() -> None:
    assert parse_scopes("send:orders-*  receive:*") == {"send:orders-*", "receive:*"}
    assert parse_scopes(["send:a receive:b", "admin"]) == {"send:a", "receive:b", "admin"}


@pytest.mark.parametrize("text", ["", "   ", "send:ok bogus"])
def test_parse_scopes_rejects_empty_and_bad(text: str) -> None:
    with pytest.raises(InvalidRequest):
        parse_scopes(text)


def test_known_scopes_drops_foreign_ones() -> None:
    assert known_scopes("openid profile send:q") == {"send:q"}
    assert known_scopes(["email", "receive:*"]) == {"receive:*"}


def test_format_scopes_is_stable() -> None:
    assert format_scopes({"send:b", "admin", "receive:a"}) == "admin receive:a send:b"


@pytest.mark.parametrize(
    ("inner", "outer", "within"),
    [
        ("orders", "orders", True),
        ("orders-1", "orders-*", True),
        ("orders-*", "orders-*", True),
        ("orders-eu-*", "orders-*", True),
        ("orders-1?", "orders-*", True),
        ("orders-?", "*", True),
        ("*", "*", True),
        ("orders-1", "orders-?", True),
        ("orders", "orders-*", False),
        ("orders*", "orders-*", False),
        ("*", "orders-*", False),
        ("orders-*", "orders-1", False),
        ("orders?", "orders-*", False),
        # Contained, but outside what we can prove simply: refused on purpose.
        ("a?c", "a*c", False),
        ("ab*", "a?*", False),
    ],
)
def test_pattern_within(inner: str, outer: str, within: bool) -> None:
    assert pattern_within(inner, outer) is within


def test_scope_within_respects_action_and_admin() -> None:
    granted = {"send:orders-*", "receive:*"}
    assert scope_within("send:orders-eu", granted)
    assert scope_within("receive:anything", granted)
    assert not scope_within("receive:anything", {"send:*"})
    assert not scope_within("send:billing", granted)
    assert not scope_within("admin", granted)
    assert scope_within("admin", {"admin"})
    assert scope_within("send:*", {"admin"})


def test_scopes_beyond_lists_the_excess() -> None:
    assert scopes_beyond({"send:orders-1", "receive:x"}, {"send:orders-*", "receive:*"}) == []
    assert scopes_beyond({"send:*", "admin", "receive:x"}, {"send:orders-*", "receive:*"}) == [
        "admin",
        "send:*",
    ]
