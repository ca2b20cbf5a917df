"""Node addresses as the cluster map holds them (``host:port``, ``[v6]:port``)."""

from __future__ import annotations

from ...errors import Unavailable


class NodeUnreachable(Unavailable):
    """The request was not sent (no connection to the node): retrying it is always safe."""


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as a pair; ``InvalidRequest``-free: a bad one is
    ``unavailable`` (it came from the cluster map, not from the caller)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise NodeUnreachable(f"bad node address {address!r}")
    return host.strip("[]"), int(port)
