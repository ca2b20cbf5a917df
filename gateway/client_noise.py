"""Quiet the server's log about clients that send garbage before we know who they are.

uvicorn logs an invalid UTF-8 text frame with a full traceback at ERROR, once per frame.
The client already gets its 1007; the operator needs to know it happens, not 40 lines
per attempt, and an unauthenticated client must not be able to flood the log. This
filter turns such records into one WARNING line per interval, with a count.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

# Messages uvicorn logs for a misbehaving client (not for a fault of ours).
CLIENT_FAULTS = frozenset({"Invalid UTF-8 sequence received from client."})


class ClientNoiseFilter(logging.Filter):
    """At most one line per ``interval_s`` for :data:`CLIENT_FAULTS`, without traceback."""

    def __init__(self, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._clock = clock
        self._next_at = 0.0
        self._suppressed = 0
        self.users = 0  # servers that installed it (install())

    def reset(self) -> None:
        """Report the next client fault at once (a new interval starts with it)."""
        self._next_at = 0.0
        self._suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg not in CLIENT_FAULTS:
            return True
        now = self._clock()
        if now < self._next_at:
            self._suppressed += 1
            return False
        self._next_at = now + self.interval_s
        more = f" ({self._suppressed} more since the last report)" if self._suppressed else ""
        self._suppressed = 0
        record.msg = f"client protocol error: {record.getMessage()}{more}"
        record.args = ()
        record.exc_info = None
        record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def install(logger_name: str = "uvicorn.error") -> Callable[[], None]:
    """Attach the filter to uvicorn's error logger; return the function that detaches it.

    The logger is the process's, so servers in one process (tests, embedding apps) share one
    filter, attached while any of them runs: a filter per server would let one server's
    interval silence another's reports, since every record passes every filter."""
    logger = logging.getLogger(logger_name)
    noise = installed(logger_name)
    if noise is None:
        noise = ClientNoiseFilter()
        logger.addFilter(noise)
    noise.users += 1

    def detach() -> None:
        noise.users -= 1
        if noise.users == 0:
            logger.removeFilter(noise)

    return detach


def installed(logger_name: str = "uvicorn.error") -> ClientNoiseFilter | None:
    """The filter attached to the logger, if a server runs."""
    for existing in logging.getLogger(logger_name).filters:
        if isinstance(existing, ClientNoiseFilter):
            return existing
    return None
