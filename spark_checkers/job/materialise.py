"""Materialising a table once so that every later rule and metric reads it (``freeze_table``): a local
checkpoint for a small check, a persist read as a leaf for a big one, with constant columns left out and
structs flattened."""

from __future__ import annotations

import os
import uuid

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_checkers.job.timing import timed


def freeze_mode(small: bool) -> str:
    """How ``freeze_table`` materialises: "checkpoint" for a small check (a run's history), "persist" for a big one;
    $ORDEAL_CHECKER_FREEZE overrides (the benchmark compares the two side by side)."""
    mode = os.environ.get("ORDEAL_CHECKER_FREEZE") or ("checkpoint" if small else "persist")
    if mode not in ("checkpoint", "persist"):
        raise ValueError(f"$ORDEAL_CHECKER_FREEZE={mode!r}: expected checkpoint or persist")
    return mode


def freeze_table(df, cached: list, label: str, mode: str = "persist", constant: dict | None = None, flatten: bool = False,
                 counts: dict[str, int] | None = None):
    """Materialise once (memory, spilling to disk), so every later rule and metric reads the result instead of
    recomputing it.  Eagerly (one job): caching lazily inside the one final query made a small check several
    times slower (docs/measurements.md).

    "checkpoint" (a small check): the result becomes a leaf of every later plan (an eager local checkpoint,
    memory and disk).  A small check's cost is the driver's: every later query re-analyses and re-optimises
    the lineage of what it reads, and matches it against the cache; with leaves that work is gone, and the
    driver's and the JVM's time per small check drop markedly (docs/measurements.md).  "persist" (a big check):
    a plain persist, whose lost block is recomputed from its lineage instead of failing the check (a local
    checkpoint's block lost under load can fail a big check).

    ``constant``: columns with one value in every row (``run_id`` in a one-run check; the run's whole row of the
    runs table for the per-subscriber table), left out of what is stored and put back as literals of their
    type.  Stored, such a column was written, kept and read back per row, and was a real key of every later
    sort and join instead of a literal the optimiser drops from them.

    ``flatten``: each struct column stored as one column per field plus a null flag, rebuilt on read.  Why:
    Spark's cache serializer reads a table as columns only if every column of it is a primitive; one struct,
    string or array makes every read of it build a row per cached row.  The per-subscriber table held the
    offline window (``k``), the run's queue policy and its unpromised fault times, and is read about ten times:
    flattened, with the run's columns as constants, a warm big check is faster (docs/measurements.md).

    ``counts``: the names of columns whose non-null values are counted ("rows": every row), filled in with the
    numbers; a persist counts them in its materialising job, which reads every row anyway (a count asked of the
    table later is a job more), a checkpoint in one job after."""
    types = {f.name: f.dataType for f in df.schema.fields}
    columns = df.columns
    constant = {name: value for name, value in (constant or {}).items() if name in types}
    structs = [c for c in columns if flatten and c not in constant and isinstance(types[c], T.StructType)]
    if constant or structs:
        df = df.select(*[c for c in columns if c not in constant and c not in structs],
                       *[F.col(c)[f].alias(f"{c}__{f}") for c in structs for f in types[c].fieldNames()],
                       *[F.col(c).isNull().alias(f"{c}__null") for c in structs])
    with timed(f"materialise {label}"):
        if mode == "checkpoint":
            frozen = df.localCheckpoint(eager=True, storageLevel=StorageLevel.MEMORY_AND_DISK)
            cached.append(frozen)
            if counts is not None:
                counts.update(_counted(frozen, counts))
        else:
            frozen = df.persist(StorageLevel.MEMORY_AND_DISK)
            cached.append(frozen)
            if counts is None:
                frozen.count()
            else:
                counts.update(_counted(frozen, counts))
            frozen = _cache_leaf(frozen, cached)
    if not (constant or structs):
        return frozen

    def read_back(c: str):
        if c in constant:
            return F.lit(constant[c]).cast(types[c]).alias(c)
        if c in structs:
            fields = [F.col(f"{c}__{f}").alias(f) for f in types[c].fieldNames()]
            return F.when(~F.col(f"{c}__null"), F.struct(*fields)).alias(c)
        return F.col(c)

    return frozen.select(*[read_back(c) for c in columns])


def _counted(df, columns) -> dict[str, int]:
    """The number of non-null values of each of ``columns`` in ``df`` ("rows": of rows), in one job."""
    return df.agg(*[(F.count(F.lit(1)) if c == "rows" else F.count(c)).alias(c) for c in columns]).first().asDict()


class TempView:
    """A temporary view a Connect check made (``_cache_leaf``): in ``cached`` beside its table, dropped with it."""

    def __init__(self, session, name: str):
        self.session, self.name = session, name

    def unpersist(self) -> None:
        self.session.catalog.dropTempView(self.name)


def _cache_leaf(frozen, cached: list):
    """A persisted table as a leaf: in a classic session the cache's own relation, which every later plan scans
    as it would have scanned the cache (columnar, with the table's partitioning and order), without the
    lineage beneath it; on Spark Connect a temporary view of it (dropped with the table, ``TempView``).

    Why: a classic session analyses each DataFrame step when it is made, over the whole plan beneath it,
    and the plan beneath every rule held the lineage of five persisted tables.  Building the rules and
    metrics took seconds of the driver's time in a big check, with every task slot idle (the stage timeline
    shows the gap).  The cache's relation keeps the lineage for itself: a lost block is still recomputed.
    A Connect client has no handle on the server's relation, and every query it sends carries the whole plan
    beneath it, which the server resolves again.  A view is resolved once, when it is made; a query names it.
    On a warm server a view shortens the fixed cost of a big-plan check of a small history, and changes nothing
    measurable for a big history (docs/measurements.md)."""
    if os.environ.get("ORDEAL_CHECKER_LEAVES") == "0":
        return frozen
    jdf = getattr(frozen, "_jdf", None)
    session = frozen.sparkSession
    if jdf is None:
        view = TempView(session, f"ordeal_frozen_{uuid.uuid4().hex}")
        frozen.createOrReplaceTempView(view.name)
        cached.append(view)
        return session.table(view.name)
    found = session._jsparkSession.sharedState().cacheManager().lookupCachedData(jdf)
    if found.isEmpty():  # not cached after all (a persist the cache manager refused): the lineage it is
        return frozen
    relation = found.get().cachedRepresentation()
    return DataFrame(session._jvm.org.apache.spark.sql.classic.Dataset.ofRows(session._jsparkSession, relation),
                     session)
