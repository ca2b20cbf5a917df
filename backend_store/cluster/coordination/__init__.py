"""etcd: the coordinator interface and its aetcd implementation, the keys and records, watches."""
