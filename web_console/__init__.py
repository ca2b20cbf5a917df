"""The operator console: queue depth, in-flight, dead letters, consumers, nodes, alerts. Not built yet."""
