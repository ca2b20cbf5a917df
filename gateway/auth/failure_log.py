"""Authentication failures in the log: at most one line a minute per key id.

A failure is worth a line (a revoked key still in use, a client with the wrong secret), but
anyone who has seen a key id (it is not secret: it names the key in lists and logs) can fail
as often as the network lets them. So each key id gets one line per :data:`INTERVAL_S`,
saying how many failures the line stands for; the rest are counted, not written. Key ids
are remembered in a bounded table (the oldest dropped first), so made-up ids cannot grow it.
The clock is injected (tests step it).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("pushgate.auth")

INTERVAL_S = 60.0
MAX_KEY_IDS = 10_000
# Key ids come from the request: never log more of one than this.
_KEY_ID_CHARS = 64


@dataclass(slots=True)
class _Seen:
    logged_at: float
    since: int = 0  # failures not written since logged_at


class FailureLog:
    """Log authentication failures, one line per key id per ``interval_s``."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        interval_s: float = INTERVAL_S,
        max_key_ids: int = MAX_KEY_IDS,
    ) -> None:
        self._clock = clock
        self._interval_s = interval_s
        self._max = max_key_ids
        self._seen: OrderedDict[str, _Seen] = OrderedDict()

    def note(self, key_id: str, reason: str) -> None:
        """A failed authentication of ``key_id`` (an API key id, an AWS access key id)."""
        key_id = key_id[:_KEY_ID_CHARS]
        now = self._clock()
        seen = self._seen.get(key_id)
        if seen is not None and now - seen.logged_at < self._interval_s:
            seen.since += 1
            return
        suppressed = 0 if seen is None else seen.since
        self._seen[key_id] = _Seen(now)
        self._seen.move_to_end(key_id)
        if len(self._seen) > self._max:
            self._seen.popitem(last=False)
        log.warning(
            "authentication failed for key id %r: %s (%d more failures of it since the last line)",
            key_id,
            reason,
            suppressed,
        )
