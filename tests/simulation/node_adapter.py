"""The node's decisions as the simulation takes them: today's production code, called as is.

The simulated node (:mod:`.sim_node`) gathers what it knows and does the I/O each decision
asks for, as ``node/node.py`` does; the decisions themselves are production code, named here
so that this is the one file that says which production code decides:

- what a node does with the replicas it hosts (serve, delete on a tombstone, keep as
  strays, refuse an untrusted etcd): ``node/reconcile.py``, :func:`decide_replicas`;
- what it does about leadership of one partition (serve, step down, resign for lack of a
  quorum, hand over, hold off, campaign) and the I/O that carries it out:
  ``node/leadership.py``'s :class:`NodeLeadership`, driven whole on the node's clock,
  its simulated etcd session and its replicas (:class:`.sim_partition.SimPartitionHost`).

- whether a node trusts etcd at all, creating or adopting the cluster's id, and whether etcd
  went back in time (raising the incarnation past it): ``node/node_identity.py``'s
  :class:`NodeIdentity` (over ``coordination/identity.py`` and ``coordination/timeline.py``),
  its ``DATA/cluster-id`` on the model disk.
"""

from __future__ import annotations

from backend_store.cluster.node import leadership, node_identity, reconcile

# Hosted replicas: node/reconcile.py.
decide_replicas = reconcile.decide
Decision = reconcile.Decision

# Leadership of one partition: node/leadership.py, decisions and their shell.
NodeLeadership = leadership.NodeLeadership

# The node's trust in etcd and its memory of it: node/node_identity.py.
NodeIdentity = node_identity.NodeIdentity
