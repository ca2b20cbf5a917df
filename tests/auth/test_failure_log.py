"""Authentication failures are logged at most once a minute per key id (a stepped clock)."""

from __future__ import annotations

import logging

import pytest

from gateway.auth.failure_log import FailureLog


def test_one_line_a_minute_per_key_id_counting_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    now = [1000.0]
    failures = FailureLog(clock=lambda: now[0], max_key_ids=2)
    with caplog.at_level(logging.WARNING, logger="pushgate.auth"):
        for _ in range(5):
            failures.note("k1", "bad signature")
        failures.note("k2", "revoked")
        now[0] += 59.9
        failures.note("k1", "bad signature")
        now[0] += 0.1
        failures.note("k1", "bad signature")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "authentication failed for key id 'k1': bad signature (0 more failures of it since the last line)",
        "authentication failed for key id 'k2': revoked (0 more failures of it since the last line)",
        "authentication failed for key id 'k1': bad signature (5 more failures of it since the last line)",
    ]


def test_made_up_key_ids_cannot_grow_the_table_or_the_line(caplog: pytest.LogCaptureFixture) -> None:
    failures = FailureLog(clock=lambda: 0.0, max_key_ids=3)
    with caplog.at_level(logging.WARNING, logger="pushgate.auth"):
        for i in range(10):
            failures.note(f"id{i}", "unknown")
        failures.note("x" * 10_000, "unknown")
    assert len(failures._seen) == 3
    assert all(len(r.getMessage()) < 200 for r in caplog.records)
    # The oldest id was forgotten, so it is logged again; a remembered one is not.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pushgate.auth"):
        failures.note("id0", "unknown")
        failures.note("id9", "unknown")
    assert [r.getMessage().split("'")[1] for r in caplog.records] == ["id0"]
