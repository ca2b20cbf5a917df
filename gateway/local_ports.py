"""Free TCP ports for the processes started together on one machine (``pushgate
dev-cluster``, the test fixtures, the benchmarks).

Binding to port 0 and closing is not enough: the kernel takes that port from its ephemeral
range, where outgoing connections also take their source ports, and may hand the same port to
the next caller. Two children started together could get one port, or a child could lose its
port to a connection made meanwhile (both happened in the cluster tests). These ports come
from below the ephemeral range when there is room, and are distinct within one call.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_FLOOR = 10000  # well above the ports of system services
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports that were free on ``host`` a moment ago."""
    held: list[socket.socket] = []
    try:
        low = _ephemeral_low()
        if low - _FLOOR >= 1000:
            for port in random.sample(range(_FLOOR, low), min(low - _FLOOR, 50 * count)):
                if len(held) == count:
                    break
                sock = socket.socket()
                try:
                    sock.bind((host, port))
                except OSError:
                    sock.close()
                    continue
                held.append(sock)
        while len(held) < count:  # no room below the range (or not Linux): the kernel's choice
            sock = socket.socket()
            sock.bind((host, 0))
            held.append(sock)
        return [sock.getsockname()[1] for sock in held]
    finally:
        for sock in held:
            sock.close()


def free_port(host: str = "127.0.0.1") -> int:
    """One port, as :func:`free_ports`."""
    return free_ports(1, host)[0]
