"""The gateway side of the cluster: ClusterBackend, the Backend for cluster:// URLs."""
