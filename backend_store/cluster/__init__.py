"""The distributed backend (see docs/cluster.md and ARCHITECTURE.md, "The cluster").

A room per part and per process role; the gateway side and the node side never import each
other (``tests/cluster/test_rooms.py`` holds the walls):

- ``protocol``: the node protocol, both sides of the wire (frames and the connection state
  machine, sans-I/O; their asyncio shell; operations on the wire; TLS).
- ``coordination``: etcd behind a small project-owned interface; the keys and records.
- ``replication``: one partition's log shipped from its leader to its followers; it sees the
  store only through ``ReplicaStore``.
- ``node``: the node process (``pushgate node``) and the partition replicas it hosts.
- ``manager``: the cluster manager (``pushgate manager``).
- ``client``: the gateway side, ``ClusterBackend`` (the ``Backend`` for ``cluster://``).
- ``commands``: the two process roles' command lines.

The store itself (``lmdb_store``) knows no peers.
"""
