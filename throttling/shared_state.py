"""Everything one gateway shares with the others, built from one URL.

``memory://`` keeps it all in this process (one gateway); ``redis://host:port`` shares it
through Redis: rate-limit counters (:class:`Limiter`), pub/sub (:class:`Broadcaster`:
wake-ups, cache invalidations) and a cache (the dedupe front). One
:class:`SharedStateHealth` says whether Redis answers, for all three.
"""

from __future__ import annotations

from .broadcast import Broadcaster, open_broadcaster
from .health import SharedStateHealth
from .limiter import Limiter, Strategy
from .shared_budget import LOCAL_SHARE
from .shared_cache import SharedCache, open_cache
from .url import SharedStateUrl, parse_shared_state_url


class SharedState:
    def __init__(
        self,
        url: str | None,
        *,
        fail_closed: bool = False,
        strategy: Strategy = "sliding-window-counter",
        timeout_s: float = 0.5,
        retry_interval_s: float = 1.0,
        local_share: float = LOCAL_SHARE,
    ) -> None:
        self.url: SharedStateUrl = parse_shared_state_url(url, timeout_s)
        self.health = SharedStateHealth(
            "memory" if self.url.is_memory else "redis", retry_interval_s=retry_interval_s
        )
        self.limiter = Limiter(
            self.url, self.health, strategy=strategy, fail_closed=fail_closed, local_share=local_share
        )
        self.broadcaster: Broadcaster = open_broadcaster(self.url, self.health)
        self.cache: SharedCache = open_cache(self.url, self.health)

    @property
    def shared(self) -> bool:
        """Whether other processes see this state (Redis), or only this one (memory)."""
        return not self.url.is_memory

    async def start(self) -> None:
        await self.broadcaster.start()

    async def close(self) -> None:
        await self.broadcaster.close()
        await self.cache.close()
        await self.limiter.close()

    def detail(self) -> dict[str, object]:
        """For ``/readyz``: which store, and whether it answers."""
        return {"url": self.url.display, **self.health.detail()}
