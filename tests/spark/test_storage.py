"""The report's storages, one contract run on both: local files, and a Hadoop file system
through the driver's JVM (``viewfs://``, mounted by the session's Hadoop configuration on a
local directory: a real scheme other than ``file:``, as a cluster's ``hdfs://`` would be)."""

from __future__ import annotations

import shutil
import threading
import uuid
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark.io import UsageRoot, check_file, find_usage_files
from spark.storage import HadoopStorage, LocalStorage, Storage, StorageError, join, open_storage
from tests.spark.records import DAY, at, write_window


class Place:
    """A storage, a location on it, and the local directory that location is."""

    def __init__(self, storage: Storage, base: str, local: Path) -> None:
        self.storage, self.base, self.local = storage, base, local

    def at(self, *parts: str) -> str:
        return join(self.base, *parts)


@pytest.fixture(params=["local", "hadoop"])
def place(request: pytest.FixtureRequest, spark: SparkSession, tmp_path: Path) -> Place:
    if request.param == "local":
        return Place(LocalStorage(), str(tmp_path), tmp_path)
    # A mount table of its own: Hadoop caches a file system per scheme and authority.
    table = f"t{uuid.uuid4().hex[:10]}"
    spark._jsc.hadoopConfiguration().set(f"fs.viewfs.mounttable.{table}.link./base", f"file://{tmp_path}")
    return Place(HadoopStorage(spark), f"viewfs://{table}/base", tmp_path)


def test_open_storage_picks_by_scheme(spark: SparkSession) -> None:
    assert isinstance(open_storage("/srv/usage", spark), LocalStorage)
    assert isinstance(open_storage("file:///srv/usage", None), LocalStorage)
    assert isinstance(open_storage("viewfs://cluster/usage", spark), HadoopStorage)
    with pytest.raises(StorageError):
        open_storage("hdfs://namenode/usage", None)


def test_listing_skips_unfinished_writes_markers_and_directories(place: Place) -> None:
    (place.local / "b.parquet").write_bytes(b"12345")
    (place.local / "a.parquet").write_bytes(b"1")
    (place.local / ".c.parquet.tmp").write_bytes(b"unfinished")
    (place.local / "_SUCCESS").write_bytes(b"")
    (place.local / "date=2026-11-20").mkdir()
    (place.local / ".staging").mkdir()
    storage = place.storage
    assert storage.list_files(place.base) == [(place.at("a.parquet"), 1), (place.at("b.parquet"), 5)]
    assert storage.list_dirs(place.base) == [place.at("date=2026-11-20")]
    assert storage.list_files(place.at("missing")) == [] and storage.list_dirs(place.at("missing")) == []
    assert storage.qualify(place.base) == storage.qualify(place.base + "/")


def test_small_files_are_read_and_replaced_whole(place: Place) -> None:
    storage, target = place.storage, place.at("summary.csv")
    storage.write_bytes(target, b"first version, longer")
    storage.write_bytes(target, b"second")
    assert storage.read_bytes(target) == b"second" and (place.local / "summary.csv").read_bytes() == b"second"
    assert storage.read_tail(target, 6, 3) == b"ond"
    assert [Path(p).name for p, _ in storage.list_files(place.base)] == ["summary.csv"]  # no temp left


def test_a_directory_is_replaced_whole_and_renames_never_overwrite(place: Place) -> None:
    storage = place.storage
    for name, content in (("old", b"old"), ("new", b"new")):
        (place.local / name).mkdir()
        (place.local / name / "part.parquet").write_bytes(content)
    with pytest.raises(StorageError):
        storage.rename(place.at("new"), place.at("old"))
    storage.replace_dir(place.at("new"), place.at("period"))  # nothing there yet
    (place.local / "newer").mkdir()
    (place.local / "newer" / "part.parquet").write_bytes(b"newer")
    storage.replace_dir(place.at("newer"), place.at("period"))
    assert (place.local / "period" / "part.parquet").read_bytes() == b"newer"
    assert sorted(p.name for p in place.local.iterdir() if not p.name.endswith(".crc")) == ["old", "period"]
    storage.delete(place.at("old"))
    storage.delete(place.at("old"))  # already gone: nothing to do
    assert not storage.exists(place.at("old")) and storage.exists(place.at("period"))


def test_a_second_run_on_one_output_waits_locally_and_is_refused_elsewhere(place: Place) -> None:
    storage, lock = place.storage, place.at(".lock")
    with storage.lock(lock):
        if isinstance(storage, HadoopStorage):
            with pytest.raises(StorageError, match="another report"), storage.lock(lock):
                pass
        else:
            got = threading.Event()

            def second() -> None:
                with storage.lock(lock):
                    got.set()

            thread = threading.Thread(target=second)
            thread.start()
            # A fixed wait only lets a wrong outcome show: the second must not get in.
            assert not got.wait(0.3)
    if isinstance(storage, LocalStorage):
        thread.join(10)
        assert got.is_set()  # it got the lock once the first let go
    with storage.lock(lock):
        pass  # free again


def test_files_are_found_and_checked_through_either_storage(place: Place) -> None:
    good = write_window(
        place.local, at(1), 0, [dict(tenant="acme", queue="q", operation="send", transport="http")]
    )
    truncated = good.with_name("truncated.parquet")
    truncated.write_bytes(good.read_bytes()[:-20])
    copy_dir = place.local / "elsewhere" / good.parent.relative_to(place.local / "usage")
    copy_dir.mkdir(parents=True)
    shutil.copy(good, copy_dir / good.name)
    root = UsageRoot(place.storage.qualify(place.at("usage")), place.storage)
    same_root_again = UsageRoot(place.storage.qualify(place.at("usage") + "/"), place.storage)
    other = UsageRoot(place.storage.qualify(place.at("elsewhere")), place.storage)
    files, bad = find_usage_files([root, same_root_again, other], DAY, at(24))
    # One file reached twice through one directory is one file; a copy elsewhere is a file
    # of its own (same file id: the report reads one of the two).
    assert [(Path(f.path).name, f.rows, f.file_id, f.gateway_id) for f in files] == [
        (good.name, 1, "gw-0", "gw"),
        (good.name, 1, "gw-0", "gw"),
    ]
    assert files[0].path != files[1].path
    assert [(b.name, b.reason) for b in bad] == [
        ("truncated.parquet", "unreadable: not a Parquet file (no footer)")
    ]
    at_good = join(root.location, *good.relative_to(place.local / "usage").parts)
    assert check_file(place.storage, at_good, good.stat().st_size) == (1, "gw-0", None)
