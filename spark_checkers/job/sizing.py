"""How big a check plans for (``SMALL_BYTES``: a run's history is small, all fixed cost) and the per-check SQL
settings of each plan shape (``PLANS``: "small", "big")."""

from __future__ import annotations

import os

# Below this many bytes of history (a run: 10k-100k events are 0.3-3 MB) a check is all fixed cost.
SMALL_BYTES = int(os.environ.get("ORDEAL_CHECKER_SMALL_BYTES", str(64 << 20)))


BIG_SPLIT_BYTES = 32 << 20  # the most of a big check's history one scan task reads (session_settings)


SMALL_SPLIT_BYTES = 128 << 20  # a small check's: Spark's default, set again because a shared server keeps settings


PLANS = ("small", "big")  # the two shapes of a check's plan (session_settings, build's ``small``)


def plan_bytes(total_bytes: int, plan: str | None) -> int:
    """The history size a check plans for: its own, or one of the forced shape's (``check_runs(plan=...)``)."""
    if plan == "big":
        return max(total_bytes, SMALL_BYTES)
    if plan == "small":
        return min(total_bytes, SMALL_BYTES - 1)
    return total_bytes


def shuffle_partitions(total_bytes: int) -> int:
    """Few partitions for small histories (task overhead dominates), more for big ones."""
    if total_bytes < SMALL_BYTES:
        return 1
    return int(max(2, min(64, total_bytes // (24 << 20))))


def session_settings(total_bytes: int) -> dict[str, str]:
    """Per-check SQL settings by input size.  A small check (a run's history: 10k-100k events, a few MB) is
    all fixed cost: one partition per shuffle and no adaptive re-planning between stages, which costs a small
    check a good part of its JVM time (docs/measurements.md).  A big one keeps adaptive execution and more
    partitions."""
    small = total_bytes < SMALL_BYTES
    return {"spark.sql.shuffle.partitions": str(shuffle_partitions(total_bytes)),
            "spark.sql.adaptive.enabled": "false" if small else "true",
            # A big check's four materialised tables are cached uncompressed: compressing costs a hash-map
            # lookup per string value and row (dictionary encoding's statistics) for tables read a few times
            # and dropped: uncompressed, a big check is faster (docs/measurements.md).
            "spark.sql.inMemoryColumnarStorage.compressed": "true" if small else "false",
            # A big check's scans in splits of at most BIG_SPLIT_BYTES, so the cores share them evenly: with
            # Spark's default a history of a few big files was read by fewer tasks than files, and one core
            # idled through the end of each scan stage (docs/measurements.md).  A small check keeps Spark's
            # default, which packs a run's few parts into one task.
            "spark.sql.files.maxPartitionBytes": str(SMALL_SPLIT_BYTES if small else BIG_SPLIT_BYTES)}
