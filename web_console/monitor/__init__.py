"""What the console, the alert engine and the metrics read: periodic samples of every queue.

:class:`~web_console.monitor.sampler.QueueSampler` reads the store (all tenants' queue
stats, storage use, cluster state when there is a cluster) every few seconds and soon
after a send, keeps an hour of depth, rate and storage history, and tells subscribers
about each sample.
"""

from .cluster_sample import (
    ClusterIdentitySample,
    NodeSample,
    NodeStorageSample,
    PartitionSample,
    ReplicaSample,
    StraySample,
)
from .history import DepthHistory, StorageHistory
from .rates import COUNTERS, RateHistory, RatePoint
from .sampler import MonitorSources, QueueSampler
from .snapshot import QueueSample, Snapshot

__all__ = [
    "COUNTERS",
    "ClusterIdentitySample",
    "DepthHistory",
    "MonitorSources",
    "NodeSample",
    "NodeStorageSample",
    "PartitionSample",
    "QueueSample",
    "QueueSampler",
    "RateHistory",
    "RatePoint",
    "ReplicaSample",
    "Snapshot",
    "StorageHistory",
    "StraySample",
]
