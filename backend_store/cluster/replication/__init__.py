"""A partition's log shipped from its leader to its followers; sees the store only as ReplicaStore."""
