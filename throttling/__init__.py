"""Rate limits and quotas (the `limits` library, in memory or through Redis). Not built yet."""
