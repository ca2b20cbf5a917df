"""The node's decisions as the simulation takes them: today's production functions, called as is.

The simulated node (:mod:`.sim_node`) gathers what it knows and does the I/O each decision
asks for, as ``node/node.py`` and ``node/leadership.py`` do; the decisions themselves are
the production code's pure functions, named here so that this is the one file that says
which production code decides:

- what a node does with the replicas it hosts (serve, delete on a tombstone, keep as
  strays, refuse an untrusted etcd): ``node/reconcile.py``, :func:`decide_replicas`;
- what it does about leadership of one partition (serve, step down, resign for lack of a
  quorum, hand over, hold off, campaign): ``node/leadership.py``, :func:`decide_leadership`.

Whether a node trusts etcd at all is ``coordination/identity.py``'s ``judge_node``, which
:mod:`.sim_node` calls directly.
"""

from __future__ import annotations

from backend_store.cluster.node import leadership, reconcile

# Hosted replicas: node/reconcile.py.
decide_replicas = reconcile.decide
Decision = reconcile.Decision

# Leadership of one partition: node/leadership.py.
decide_leadership = leadership.decide
Situation = leadership.Situation
Action = leadership.Action
