"""Usage files: layout, schema, atomic writes, and what a crash mid-write leaves."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gateway.usage.aggregator import UsageAggregator
from gateway.usage.record import SCHEMA, UsageRecord
from gateway.usage.writer import UsageWriter
from tests.conftest import ManualClock

HOUR_START = dt.datetime(2026, 11, 20, 13, 0, tzinfo=dt.UTC).timestamp()


def _records(clock: ManualClock, n: int = 3) -> list[UsageRecord]:
    agg = UsageAggregator(clock)
    for i in range(n):
        agg.observe("acme", f"q{i}", "send", "http", count=i + 1, nbytes=10, latency_s=0.001)
    clock.advance(10)
    return agg.take("gw-a", 4)


def test_file_lands_in_its_hour_partition_with_the_schema(tmp_path: Path) -> None:
    clock = ManualClock(HOUR_START + 59 * 60)
    path = UsageWriter(tmp_path, "gw-a").write(_records(clock), 4)
    assert path == tmp_path / "date=2026-11-20" / "hour=13" / "gw-a-0000000004.parquet"
    table = pq.read_table(path)
    assert table.schema.equals(SCHEMA, check_metadata=False)
    assert table.column("count").to_pylist() == [1, 2, 3]
    assert table.column("record_id").to_pylist() == ["gw-a-4-0", "gw-a-4-1", "gw-a-4-2"]
    assert table.schema.metadata[b"pushgate.usage.schema_version"] == b"1"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left


def test_a_crash_mid_write_leaves_no_file_a_reader_would_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process dies between writing the bytes and the rename: only a dot-file remains,
    which readers skip and the next start removes."""
    clock = ManualClock(HOUR_START)
    writer = UsageWriter(tmp_path, "gw-a")

    def crash(src: object, dst: object) -> None:
        raise KeyboardInterrupt  # stands for SIGKILL: nothing after this line runs

    monkeypatch.setattr(os, "rename", crash)  # the writer renames through os.rename
    with pytest.raises(KeyboardInterrupt):
        writer.write(_records(clock), 0)
    monkeypatch.undo()
    # The writer cleans its temp file when it can; a real SIGKILL cannot, so make one.
    directory = tmp_path / "date=2026-11-20" / "hour=13"
    assert [p for p in directory.iterdir() if not p.name.startswith(".")] == []
    stale = directory / ".gw-a-0000000000.parquet.tmp"
    stale.write_bytes(b"PAR1 half a file")
    os.utime(stale, (HOUR_START, HOUR_START))
    fresh = directory / ".gw-b-0000000000.parquet.tmp"
    fresh.write_bytes(b"PAR1 another gateway writing right now")
    assert writer.remove_stale_temps(older_than_s=600) == 1
    assert not stale.exists() and fresh.exists()


def test_an_empty_window_is_not_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        UsageWriter(tmp_path, "gw").write([], 0)
