"""Benchmarks: scripts run from a checkout (``python bench/<name>.py``); see bench/README.md."""
