"""What both sides read from a queue's record in etcd (``queues/{tenant}/{name}``).

Gateways write queue records (``client/metadata.py``); nodes read two things from them: the
attributes a partition's store keeps, and the dead-letter queues a queue used to have.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...attributes import BOUNDS
from ...types import QueueName

FORMER_DLQS = "former_dead_letter_queues"

# Cluster attributes the store does not know (or caps for a standalone store).
_CLUSTER_ONLY = frozenset({"partitions", "replication_factor", "replication_mode"})


def store_attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes a partition's store keeps: the queue's, without the cluster's own."""
    return {k: v for k, v in attributes.items() if k in BOUNDS and k not in _CLUSTER_ONLY}


def former_dead_letter_queues(doc: Mapping[str, Any]) -> tuple[tuple[QueueName, int], ...]:
    """The ``former_dead_letter_queues`` of a queue record's document (nodes read it too)."""
    raw = doc.get(FORMER_DLQS) or ()
    return tuple((QueueName(str(name)), int(revision)) for name, revision in raw)
