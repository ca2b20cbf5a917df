"""Tests of backend_store: real LMDB on disk, no mocks, time from an injected clock.

- ``test_contract_*.py``: the :class:`~backend_store.Backend` contract, run against every kind in
  ``harness.STORE_KINDS`` through the ``store`` / ``store_factory`` fixtures (a new backend joins by
  adding one entry there; no test is copied).
- ``test_lmdb_engine.py``: what only the embedded engine promises (encryption on the file bytes, key
  checks, replication log, group commit, full map, corrupt records, no LMDB on the event loop).
- ``test_standing_receive*.py``: the optional StandingReceive capability (skipped where absent).
- ``test_config.py``: store URLs and encryption keyrings.
- ``test_model.py``: hypothesis stateful test against a reference model.
- ``test_crash.py`` (+ ``crash_child.py``): SIGKILL a producing/consuming child; what was acknowledged stays.
"""
