"""Rate limits and shared state between gateways: in memory, or through Redis.

Knows no queues and no HTTP: the limiter answers "allowed, or retry after N seconds"
with the numbers the IETF RateLimit headers need; the broadcaster carries opaque
messages between processes; the cache stores opaque bytes. See docs/throttling.md.
"""

from __future__ import annotations

from .broadcast import Broadcaster, MemoryBroadcaster, RedisBroadcaster, open_broadcaster
from .decision import ALLOWED, Decision, Rule, Window
from .errors import InvalidLimit, SharedStateUnavailable, ThrottlingError
from .health import SharedStateHealth
from .limiter import Limiter, Strategy
from .rates import Rate, parse_rate
from .shared_cache import MemoryCache, RedisCache, SharedCache, open_cache
from .shared_state import SharedState
from .url import MEMORY_URL, SharedStateUrl, parse_shared_state_url

__all__ = [
    "ALLOWED",
    "MEMORY_URL",
    "Broadcaster",
    "Decision",
    "InvalidLimit",
    "Limiter",
    "MemoryBroadcaster",
    "MemoryCache",
    "Rate",
    "RedisBroadcaster",
    "RedisCache",
    "Rule",
    "SharedCache",
    "SharedState",
    "SharedStateHealth",
    "SharedStateUnavailable",
    "SharedStateUrl",
    "Strategy",
    "ThrottlingError",
    "Window",
    "open_broadcaster",
    "open_cache",
    "parse_rate",
    "parse_shared_state_url",
]
