"""The Spark session the checkers run on: local[2] by default, any master when asked."""

from __future__ import annotations

import os

DEFAULT_MASTER = "local[2]"


def spark_session(master: str | None = None, app_name: str = "ordeal-checkers"):
    """Get (or create) the Spark session.  ``master``: ``--spark-master``, else $ORDEAL_SPARK_MASTER, else
    local[2].  An existing session is reused as is (cold start costs 7-11 s)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and master is None:
        return active
    chosen = master or os.environ.get("ORDEAL_SPARK_MASTER") or DEFAULT_MASTER
    if chosen.startswith("local"):
        # A local check talks only to itself: keep the driver on loopback rather than the host's interface.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(chosen)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", os.environ.get("ORDEAL_SPARK_DRIVER_MEMORY", "3g"))
        .config("spark.sql.shuffle.partitions", os.environ.get("ORDEAL_SPARK_SHUFFLE_PARTITIONS", "8"))
        .config("spark.sql.adaptive.enabled", "true")
        # The delivery side is partitioned by (run, subscriber) once; joins and windows keyed by (run, subscriber,
        # ...) may then use that partitioning as it is, and a cached table keeps it (no re-shuffles).
        .config("spark.sql.requireAllClusterKeysForCoPartition", "false")
        .config("spark.sql.optimizer.canChangeCachedPlanOutputPartitioning", "false")
        .config("spark.sql.ansi.enabled", "false")  # out-of-range array lookups give null, not an error
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", "-XX:+UseParallelGC")
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
