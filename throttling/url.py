"""Shared-state URLs: ``memory://`` (one process) or ``redis://[:password@]host:port[/db]``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from .errors import InvalidLimit

MEMORY_URL = "memory://"
_REDIS_SCHEMES = ("redis", "rediss")


@dataclass(frozen=True, slots=True)
class SharedStateUrl:
    """A parsed URL; ``timeout_s`` bounds every Redis call (connect and command)."""

    url: str
    is_memory: bool
    timeout_s: float = 0.5

    @property
    def display(self) -> str:
        """The URL without a password, for logs and ``/readyz``."""
        parts = urlsplit(self.url)
        if parts.password is None:
            return self.url
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://***@{host}{port}{parts.path}"


def parse_shared_state_url(url: str | None, timeout_s: float = 0.5) -> SharedStateUrl:
    """Parse ``url`` (None or empty: ``memory://``); :class:`InvalidLimit` for anything else."""
    if not url or url == MEMORY_URL:
        return SharedStateUrl(MEMORY_URL, True, timeout_s)
    parts = urlsplit(url)
    if parts.scheme not in _REDIS_SCHEMES or not parts.hostname:
        raise InvalidLimit(f"unsupported shared-state URL {url!r}: expected memory:// or redis://host:port")
    try:
        parts.port  # noqa: B018 (validates the port)
    except ValueError:
        raise InvalidLimit(f"bad port in {url!r}") from None
    return SharedStateUrl(url, False, timeout_s)


def redis_options(url: SharedStateUrl, *, bounded_reads: bool = True) -> dict[str, Any]:
    """Options for every Redis client here: bounded calls, and one immediate retry.

    The retry covers a pooled connection that died with a restarted Redis (the first
    call on it fails at once); redis-py's default (three retries with backoff) would
    make every request of an outage wait, which fail-open is meant to avoid.
    ``bounded_reads=False`` for a pub/sub connection, whose reads block by design.
    """
    options: dict[str, Any] = {
        "socket_connect_timeout": url.timeout_s,
        "retry": Retry(NoBackoff(), 1),
    }
    if bounded_reads:
        options["socket_timeout"] = url.timeout_s
    return options
