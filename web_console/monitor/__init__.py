"""What the console, the alert engine and the metrics read: periodic samples of every queue.

:class:`~web_console.monitor.sampler.QueueSampler` reads the store (all tenants' queue
stats, storage use, cluster state when there is a cluster) every few seconds and soon
after a send, keeps an hour of depth history, and tells subscribers about each sample.
"""

from .history import DepthHistory
from .sampler import MonitorSources, QueueSampler
from .snapshot import NodeSample, QueueSample, Snapshot

__all__ = ["DepthHistory", "MonitorSources", "NodeSample", "QueueSample", "QueueSampler", "Snapshot"]
