"""Client faults in uvicorn's log: one filter per process, however many servers run."""

from __future__ import annotations

import logging

from gateway import client_noise

NAME = "pushgate.test.client-noise"


def _fault() -> logging.LogRecord:
    return logging.LogRecord(
        NAME, logging.ERROR, __file__, 1, next(iter(client_noise.CLIENT_FAULTS)), (), None
    )


def test_servers_in_one_process_share_one_filter_until_the_last_stops() -> None:
    logger = logging.getLogger(NAME)
    first, second = client_noise.install(NAME), client_noise.install(NAME)
    noise = client_noise.installed(NAME)
    assert noise is not None and logger.filters == [noise]
    # One report per interval for the process: the second server's record is counted, not
    # let through by a filter of its own.
    assert logger.filter(_fault())
    assert not logger.filter(_fault())
    first()
    assert client_noise.installed(NAME) is noise  # the other server still runs
    second()
    assert client_noise.installed(NAME) is None and logger.filters == []
