"""The report's session settings for small inputs (``spark/session.py``): the shuffle
partitions sized per run from its input, and the defaults every master gets.

That they reach a standalone cluster as well as ``local``: the report there says how many
shuffle partitions it ran with (``tests/spark/test_shared_usage.py``).
"""

from __future__ import annotations

from typing import Any, cast

import pytest
from pyspark.sql import SparkSession

from spark.session import DEFAULTS, SHUFFLE_PARTITIONS, shuffle_partitions, sized_shuffles


@pytest.mark.parametrize(
    ("records", "cores", "partitions"),
    [
        (0, 1, 1),
        (7, 2, 2),  # the 7-record report: one partition per core, not Spark's 200
        (4_000_000, 2, 2),
        (4_000_001, 2, 3),
        (10_000_000, 2, 5),  # docs/usage.md: "a run over 10 million records on 2 cores: 5"
        (10_000_000, 16, 16),
    ],
)
def test_one_shuffle_partition_per_core_and_per_two_million_records(
    records: int, cores: int, partitions: int
) -> None:
    assert shuffle_partitions(records, cores) == partitions


def test_a_run_sizes_its_shuffles_and_puts_the_sessions_value_back(spark: SparkSession) -> None:
    before = spark.conf.get(SHUFFLE_PARTITIONS)
    with sized_shuffles(spark, 10_000_000) as partitions:
        assert partitions == 5  # local[2]: two cores, 10 million records
        assert spark.conf.get(SHUFFLE_PARTITIONS) == "5"
    assert spark.conf.get(SHUFFLE_PARTITIONS) == before


def test_shuffle_partitions_given_at_launch_are_kept() -> None:
    class Conf:
        def contains(self, key: str) -> bool:
            return key == SHUFFLE_PARTITIONS

    class Context:
        defaultParallelism = 2

        def getConf(self) -> Conf:
            return Conf()

    class RuntimeConf:
        def __init__(self) -> None:
            self.values = {SHUFFLE_PARTITIONS: "64"}

        def get(self, key: str) -> str:
            return self.values[key]

        def set(self, key: str, value: str) -> None:
            raise AssertionError(f"set {key}={value} on a session that was given it at launch")

    session: Any = type("Session", (), {"sparkContext": Context(), "conf": RuntimeConf()})()
    with sized_shuffles(cast(SparkSession, session), 10_000_000) as partitions:
        assert partitions == 64


def test_every_master_gets_the_small_input_defaults(spark: SparkSession) -> None:
    # The tests' session is the report's own builder (tests/fixtures/spark.py).
    conf = spark.sparkContext.getConf()
    for key, value in DEFAULTS.items():
        if key.endswith("extraJavaOptions"):
            # Spark puts its own JVM options (--add-opens ...) before the session's.
            assert (conf.get(key) or "").endswith(value), key
        else:
            assert conf.get(key) == value, key
    assert DEFAULTS["spark.ui.enabled"] == "false"
    assert "-XX:TieredStopAtLevel=1" in DEFAULTS["spark.executor.extraJavaOptions"]
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
