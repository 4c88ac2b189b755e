"""The JVM and Spark settings every Spark the checkers start gets: the classic in-process session
(spark_session.py) and the shared Spark Connect server (connect_server.py) read them here, so neither imports
the other for them."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_MASTER = "local[2]"
CODEGEN_CACHE_ENTRIES = "4000"

# Session-level SQL settings: set on every session, classic or Connect (a remote cluster gets them too).
SQL_CONF = {
    "spark.sql.shuffle.partitions": os.environ.get("ORDEAL_SPARK_SHUFFLE_PARTITIONS", "8"),
    "spark.sql.adaptive.enabled": "true",
    # The delivery side is partitioned by (run, subscriber) once; joins and windows keyed by (run, subscriber,
    # ...) may then use that partitioning as it is, and a cached table keeps it (no re-shuffles).
    "spark.sql.requireAllClusterKeysForCoPartition": "false",
    "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "false",
    "spark.sql.ansi.enabled": "false",  # out-of-range array lookups give null, not an error
    "spark.sql.session.timeZone": "UTC",
    # An aggregate with a digest (the latency percentiles per time bucket) keeps up to this many groups in its
    # hash map before it falls back to sorting every input row.  With the default (128) a big check's buckets
    # per task overflowed it and every delivery row was sorted (docs/measurements.md).
    "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "1024",
}


def static_conf() -> dict[str, str]:
    """Settings fixed when a local JVM starts (classic session or the local Connect server)."""
    return {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": os.environ.get("ORDEAL_SPARK_DRIVER_MEMORY", "3g"),
        # Spark's cache of compiled generated classes (default 100 entries): one check compiles a few hundred
        # (its queries' code stages), so with the default every check evicted the last one's and compiled
        # (Janino) and JIT-compiled everything anew.  Big enough for a few check shapes (small/big, one run/many)
        # at once.
        "spark.sql.codegen.cache.maxEntries": CODEGEN_CACHE_ENTRIES,
        # PySpark wraps every DataFrame and column function to record its Python call site for error messages:
        # in a classic session five calls into the JVM each (the active session, the setting, the origin set and
        # cleared), for each of the thousand-odd functions that build a check's rules: off, a warm small check is
        # markedly faster (docs/measurements.md).  A checker's error still names its invariant (api.py).  A
        # static setting: a Connect client records the call site in Python alone, no calls.
        "spark.python.sql.dataFrameDebugging.enabled": "false",
        # A JVM's first big check queues thousands of methods for its one C2 compiler thread (two cores), and
        # until C2 gets to them they run as tier 3: C1 code that also records a full profile, the slowest
        # compiled code.  With the tier-3 delay at 2 queued methods (default 5), the JIT compiles new methods at
        # tier 2 (C1, counters only) while that queue is long, and profiles them once it is short: a fresh JVM's
        # first big check is faster, small checks unchanged.  More C2 threads instead (CICompilerCount=4), or
        # higher tier-4 thresholds, helped the big check as much but slowed a fresh JVM's small checks
        # (docs/measurements.md).
        # $ORDEAL_SPARK_JAVA_OPTIONS adds JVM flags (the benchmark's A/B of JIT settings).
        "spark.driver.extraJavaOptions": " ".join(
            ["-XX:+UseParallelGC", "-XX:Tier3DelayOn=2", "-XX:Tier3DelayOff=1",
             *os.environ.get("ORDEAL_SPARK_JAVA_OPTIONS", "").split()]),
        **event_log_conf(),
    }


EVENT_LOG_ENV = "ORDEAL_SPARK_EVENT_LOG"


def event_log_conf() -> dict[str, str]:
    """With $ORDEAL_SPARK_EVENT_LOG naming a directory (made if missing), every JVM started while it is set (the
    local server, a classic session) writes Spark's event log there: one plain JSON-lines file per JVM, which
    ``benchmarks/stages.py`` reads to say where a check's task time went, job by job (and Spark's history server
    shows).  Unset: no event log.  A path that cannot be a directory is a ValueError naming the variable."""
    where = os.environ.get(EVENT_LOG_ENV, "")
    if not where:
        return {}
    path = Path(where).expanduser().resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"${EVENT_LOG_ENV}={where!r}: expected a directory for Spark's event log "
                         f"({error.strerror or error})") from None
    return {"spark.eventLog.enabled": "true", "spark.eventLog.dir": path.as_uri(),
            "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false"}


def server_conf() -> dict[str, str]:
    return {**static_conf(), **SQL_CONF}
