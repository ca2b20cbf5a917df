"""The SparkSession the report runs in: UTC, quiet, progress bars on."""

from __future__ import annotations

from pyspark.sql import SparkSession


def build_session(master: str = "local[*]", app_name: str = "pushgate-usage-report") -> SparkSession:
    """A session for the report. The time zone must be UTC: periods are UTC hours and days,
    and ``date_trunc`` cuts in the session's zone."""
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "true")
        .config("spark.sql.adaptive.enabled", "true")
    )
    if master.startswith("local"):
        # One machine: 200 shuffle partitions cost more in task overhead than they gain.
        builder = builder.config("spark.sql.shuffle.partitions", "4").config("spark.ui.enabled", "false")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
