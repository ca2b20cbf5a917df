"""Scopes: parsing, validation and the conservative "is this scope within that one" test.

A scope is ``admin``, ``metrics`` (read ``/metrics``), ``manage:<pattern>`` (create, change, purge and
delete queues), ``send:<pattern>`` or ``receive:<pattern>``; a pattern is a queue
name (``jobs.fifo`` too) or a shell-style glob of ``*`` and ``?`` over queue-name characters
(``orders-*``, ``*``). :meth:`Principal.can` decides what a scope allows; this module
decides which scopes may be delegated (``POST /v1/tokens``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from fnmatch import fnmatchcase

from backend_store.errors import InvalidRequest

ADMIN = "admin"
METRICS = "metrics"
ACTIONS = ("manage", "send", "receive")
_PATTERN = re.compile(r"[A-Za-z0-9_.*?-]{1,200}")
_WILDCARDS = frozenset("*?")


def is_valid_scope(scope: str) -> bool:
    """Whether ``scope`` is one this gateway understands."""
    if scope in (ADMIN, METRICS):
        return True
    action, sep, pattern = scope.partition(":")
    return bool(sep) and action in ACTIONS and _PATTERN.fullmatch(pattern) is not None


def parse_scopes(text: str | Iterable[str]) -> frozenset[str]:
    """Parse space-separated scopes (or an iterable of them); raise InvalidRequest on a bad one."""
    items = text.split() if isinstance(text, str) else [s for part in text for s in part.split()]
    if not items:
        raise InvalidRequest("scope must name at least one scope")
    for scope in items:
        if not is_valid_scope(scope):
            raise InvalidRequest(
                f"invalid scope {scope!r}: expected admin, metrics, manage:<pattern>, send:<pattern> or receive:<pattern>"
            )
    return frozenset(items)


def known_scopes(text: str | Iterable[str]) -> frozenset[str]:
    """The scopes of ``text`` this gateway understands, silently dropping others.

    Used for JWTs from outside identity providers, which add scopes of their own
    (``openid``, ``profile``) that mean nothing here.
    """
    items = text.split() if isinstance(text, str) else [s for part in text for s in part.split()]
    return frozenset(s for s in items if is_valid_scope(s))


def format_scopes(scopes: Iterable[str]) -> str:
    """Scopes as the space-separated string JWTs carry, in a stable order."""
    return " ".join(sorted(scopes))


def pattern_within(inner: str, outer: str) -> bool:
    """Whether every queue name matching glob ``inner`` also matches glob ``outer``.

    Glob containment in general is hard, so this answers True only when it is sure:
    the patterns are equal; ``inner`` is a plain name that ``outer`` matches; or
    ``outer`` is ``<literal prefix>*`` and ``inner`` starts with that literal prefix
    (``orders-eu-*`` and ``orders-1?`` are within ``orders-*``). Anything else, such as
    ``a?c`` against ``a*c``, is refused even when it happens to be contained.
    """
    if inner == outer:
        return True
    if not _WILDCARDS.intersection(inner):
        return fnmatchcase(inner, outer)
    if outer.endswith("*"):
        prefix = outer[:-1]
        return not _WILDCARDS.intersection(prefix) and inner.startswith(prefix)
    return False


def scope_within(inner: str, granted: Iterable[str]) -> bool:
    """Whether scope ``inner`` is no wider than some scope of ``granted`` (``admin`` covers all)."""
    granted = frozenset(granted)
    if ADMIN in granted:
        return True
    if inner in (ADMIN, METRICS):
        return inner in granted
    action, _, pattern = inner.partition(":")
    prefix = action + ":"
    return any(g.startswith(prefix) and pattern_within(pattern, g[len(prefix) :]) for g in granted)


def scopes_beyond(requested: Iterable[str], granted: Iterable[str]) -> list[str]:
    """The requested scopes that ``granted`` does not cover, sorted (empty: all are within)."""
    granted = frozenset(granted)
    return sorted(s for s in requested if not scope_within(s, granted))
