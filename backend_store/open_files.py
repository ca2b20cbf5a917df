"""The process's open-file limit, raised at start-up to what the system allows.

Every WebSocket, SSE stream, HTTP keep-alive connection, long-poll and replication link is a
file descriptor. A process starts with its parent's soft limit, which is 1024 under systemd's
default (``LimitNOFILE=1024:524288``) and in most shells. That caps a gateway at about a
thousand connections, and past it uvloop (libuv) accepts each new connection and closes it at
once: clients see a reset and the gateway logs nothing. Go's runtime raises the soft limit to
the hard one as a program starts (Go 1.19), so NATS and Centrifugo never meet this. Pushgate's
servers (``pushgate serve``, ``pushgate node``, ``pushgate manager``) do the same, and warn when
even the hard limit is low (docs/http.md, "Open files").
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

log = logging.getLogger("pushgate.open_files")

# Below this, a server warns at start-up: about this many connections, less the store's and
# the links' own descriptors.
LOW_LIMIT = 4096


@dataclass(frozen=True, slots=True)
class OpenFileLimit:
    before: int  # the soft limit the process started with
    now: int  # the soft limit after raising it
    hard: int


def raise_open_file_limit(server: str) -> OpenFileLimit:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard one; log what came of it (``server``
    names the command in the lines)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    now = soft
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            now = hard
        except (OSError, ValueError) as exc:
            # An infinite hard limit past the kernel's nr_open, or a sandbox that refuses.
            log.warning("%s: could not raise the open-file limit from %d: %s", server, soft, exc)
    if now != soft:
        log.info("%s: open-file limit raised from %d to %d", server, soft, now)
    if now < LOW_LIMIT:
        log.warning(
            "%s: the open-file limit is %d (hard limit %s): this process can hold fewer than %d"
            " connections; raise it (systemd: LimitNOFILE=65536; docker run: --ulimit"
            " nofile=65536; a shell: ulimit -Hn). docs/http.md, 'Open files'",
            server,
            now,
            "unlimited" if hard == resource.RLIM_INFINITY else hard,
            now,
        )
    return OpenFileLimit(soft, now, hard)
