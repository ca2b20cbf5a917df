"""The node process: the partition replicas it hosts, their stores, leadership and hand-over."""
