"""A usage directory several gateways share (``pushgate serve --usage-dir``): where files go,
that two writers in one directory never clash, and a directory that cannot work refused at
start in one line. (Two real gateways under traffic: tests/spark/test_shared_usage.py.)"""

from __future__ import annotations

import datetime as dt
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gateway.cli import main
from gateway.usage.aggregator import UsageAggregator
from gateway.usage.record import FILE_ID_KEY, UsageRecord
from gateway.usage.recording import UsageRecording
from gateway.usage.writer import UsageWriter
from tests.conftest import ManualClock

HOUR_START = dt.datetime(2026, 11, 20, 13, 0, tzinfo=dt.UTC).timestamp()


def _window(gateway: str, sequence: int) -> list[UsageRecord]:
    clock = ManualClock(HOUR_START + sequence)
    aggregator = UsageAggregator(clock)
    aggregator.observe("acme", "orders", "send", "http", count=sequence + 1, nbytes=10)
    clock.advance(1)
    return aggregator.take(gateway, sequence)


async def test_usage_files_go_to_the_usage_dir_and_the_audit_log_stays_in_data(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    recording = UsageRecording.build(tmp_path / "data", 3600, "edge", shared)
    assert recording.aggregator is not None and recording.flusher is not None
    await recording.flusher.start()
    recording.aggregator.observe("acme", "orders", "send", "http", count=2, nbytes=20)
    await recording.flusher.close()
    [written] = list(shared.rglob("*.parquet"))
    assert written.name.startswith("edge-") and written.parent.parent.parent == shared
    assert not (tmp_path / "data" / "usage").exists()
    assert recording.audit.root == tmp_path / "data" / "audit"


def test_two_gateways_writing_one_directory_at_once_keep_every_file_whole(tmp_path: Path) -> None:
    writers = [UsageWriter(tmp_path, "gw_a-0000aaaa"), UsageWriter(tmp_path, "gw_b-0000bbbb")]

    def write_all(writer: UsageWriter) -> list[Path]:
        return [writer.write(_window(writer.gateway_id, n), n) for n in range(40)]

    with ThreadPoolExecutor(2) as pool:
        written = [p for paths in pool.map(write_all, writers) for p in paths]
    on_disk = sorted(tmp_path.rglob("*"))
    files = [p for p in on_disk if p.is_file()]
    assert sorted(files) == sorted(written) and len(set(written)) == 80  # no name taken twice
    assert not [p for p in files if p.name.startswith(".")]  # no unfinished write left
    for path in written:
        meta = pq.read_metadata(path)
        file_id = (meta.metadata or {})[FILE_ID_KEY].decode()
        assert path.name.startswith(file_id.rpartition("-")[0]) and meta.num_rows == 1


@pytest.mark.parametrize("kind", ["file", "unwritable"])
def test_a_usage_dir_that_cannot_work_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    usage = tmp_path / "usage"
    if kind == "file":
        usage.write_text("not a directory")
        message = f"--usage-dir {usage}: not a directory"
    else:
        usage = Path("/proc/nope")
        message = "--usage-dir /proc/nope: cannot create it (No such file or directory)"
    assert main(["serve", "--data", str(tmp_path / "data"), "--usage-dir", str(usage), "--port", "0"]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"pushgate serve: {message}\n"


def test_no_usage_dir_is_checked_when_usage_is_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # With recording off nothing is ever written there: a stale flag must not stop a start.
    # The directory is checked before the port is bound: a busy port shows the check passed.
    usage = tmp_path / "a-file"
    usage.write_text("x")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = ["serve", "--data", str(tmp_path / "data"), "--usage-dir", str(usage), "--port", str(port)]
        assert main([*args, "--usage-flush-interval", "0"]) == 2
    assert capsys.readouterr().err.startswith(f"pushgate serve: cannot listen on 127.0.0.1:{port}")
