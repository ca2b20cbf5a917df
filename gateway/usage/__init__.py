"""Usage data: the observe point, the in-memory aggregator, the hour-partitioned usage
files it is flushed to, and the audit log of admin actions. See docs/usage.md."""
