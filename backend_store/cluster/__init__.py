"""The distributed backend's parts that are built so far (see docs/cluster.md).

``wire`` and ``connection``: the node protocol, sans-I/O. ``coordinator``: etcd behind a
small project-owned interface. The store itself (``lmdb_store``) knows no peers.
"""
