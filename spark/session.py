"""The SparkSession the report runs in, with settings for the report's small jobs on every
master: ``local[*]`` and a cluster alike.

The report's work is one pass over the records (partial aggregation in every task) and
then a dozen small jobs over the aggregated rows (tenants x queues x periods). Spark's
defaults are for big jobs, and on a small input they cost far more than the work:

- 200 shuffle partitions: 200 tasks per stage over a handful of rows. Each run sets the
  count from its input (:func:`shuffle_partitions`), unless it was given at launch.
- the web UI: off unless asked for (``--conf spark.ui.enabled=true``).
- the optimizing JIT compiler (C2) of the driver's and the executors' JVMs: both live for one
  report, and C2 compiles Spark's planner and generated code long after it would have paid
  off. C1 alone halved the driver's CPU for a 7-record report, cut the executor's from 20 s to
  8 s on a standalone worker, and took a 10-million-record report on that worker from 98 s to
  58 s (bench/README.md). On ``local[*]`` the driver also runs the tasks.

Everything here can be overridden with ``--conf KEY=VALUE`` (``pushgate usage report``),
except the session time zone: periods are UTC hours and days, and ``date_trunc`` cuts in
the session's zone.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator, Mapping

from pyspark.sql import SparkSession

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
DEFAULTS: dict[str, str] = {
    # Stage progress bars for a person watching, not in a log or a pipe.
    "spark.ui.showConsoleProgress": "true" if sys.stderr.isatty() else "false",
    "spark.ui.enabled": "false",
    "spark.sql.adaptive.enabled": "true",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
    "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1",
}
# One shuffle partition per this many input records, and at least one per core.
RECORDS_PER_PARTITION = 2_000_000


def build_session(
    master: str = "local[*]", app_name: str = "pushgate-usage-report", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A session for the report on ``master``: :data:`DEFAULTS`, then ``conf`` over them."""
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**DEFAULTS, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.config("spark.sql.session.timeZone", "UTC").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def shuffle_partitions(records: int, cores: int) -> int:
    """Shuffle partitions for a run over ``records`` input records on ``cores`` cores: the
    shuffled rows are partial aggregates, far fewer than the records, so one partition per
    core suffices until the input is big."""
    return max(1, cores, math.ceil(records / RECORDS_PER_PARTITION))


@contextlib.contextmanager
def sized_shuffles(spark: SparkSession, records: int) -> Iterator[int]:
    """Within: the session's shuffle partitions sized for ``records`` (restored after, so
    a caller's own session is left as it was), unless they were set at launch."""
    context = spark.sparkContext
    if context.getConf().contains(SHUFFLE_PARTITIONS):
        yield int(spark.conf.get(SHUFFLE_PARTITIONS) or "200")
        return
    before = spark.conf.get(SHUFFLE_PARTITIONS)
    partitions = shuffle_partitions(records, context.defaultParallelism)
    spark.conf.set(SHUFFLE_PARTITIONS, str(partitions))
    try:
        yield partitions
    finally:
        spark.conf.set(SHUFFLE_PARTITIONS, before or "200")
