"""The cluster manager: placement, promotion, draining and rebalancing in fenced etcd transactions."""
