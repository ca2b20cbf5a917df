"""The distributed backend (see docs/cluster.md).

``wire`` and ``connection``: the node protocol, sans-I/O; ``stream``: its asyncio shell.
``ops``: Backend operations on the wire; ``client``: ``NodeClient`` / ``NodePool``.
``coordinator`` / ``etcd_coordinator``: etcd behind a small project-owned interface;
``layout``: the keys and records in etcd. ``replication`` / ``reseed``: one partition's log
shipped from its leader to its followers. ``partition_host`` / ``node``: the node process;
``manager``: the cluster manager; ``commands``: ``pushgate node`` / ``pushgate manager``.
The store itself (``lmdb_store``) knows no peers.
"""
