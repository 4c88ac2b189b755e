"""How ``jobs.build`` runs its jobs: the driver's small tables are local relations (no Python worker processes),
and a table materialised beside the main thread is handed over even when the main thread fails."""

from __future__ import annotations

import pytest

from spark_checkers import synthetic as s

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


def test_a_driver_table_is_a_local_relation_with_the_rows_given(spark):
    """``local_frame`` keeps every row and value (nested arrays of structs, nulls, empty arrays), and in a classic
    session the plan is a local relation: ``createDataFrame`` of a list made a Python RDD, whose every job ran
    Python worker processes."""
    from pyspark.sql import types as T

    from spark_checkers import jobs

    L, S = T.LongType(), T.StringType()
    schema = T.StructType([
        T.StructField("run_id", S), T.StructField("seqs", T.ArrayType(L)),
        T.StructField("spans", T.ArrayType(T.StructType([T.StructField("s", L), T.StructField("e", L)]))),
        T.StructField("limit", T.IntegerType()), T.StructField("persistent", T.BooleanType())])
    rows = [("r1", [1, 2], [(3, 4), (5, 6)], 10, True), ("r2", [], [], None, None)]
    df = jobs.local_frame(spark, rows, schema)
    got = [(r["run_id"], r["seqs"], [(x["s"], x["e"]) for x in r["spans"]], r["limit"], r["persistent"])
           for r in df.orderBy("run_id").collect()]
    assert got == rows
    assert df.schema == schema
    if hasattr(df, "_jdf"):  # classic; a Connect client sends Arrow as a local relation whatever it is given
        plan = df._jdf.queryExecution().optimizedPlan().toString()
        assert plan.startswith("LocalRelation"), plan


def test_a_failed_preparation_hands_over_the_table_materialised_beside_it(spark, tmp_path):
    """``build`` materialises the publishes in its aside thread while ``prepare()`` (the caller's scans) runs.
    When ``prepare()`` fails, ``build`` raises its error only after the aside thread is done, with the publishes
    in ``cached``, materialised: the caller's ``finally`` releases them, and no job runs on after the check."""
    from spark_checkers import jobs
    from spark_checkers.loader import open_run

    spec = s.Spec(pairs=2, messages=12)
    run = open_run(s.write_spec(tmp_path / "run", spec))
    specs = [jobs.RunSpec(run.run_id, run.parts, run.guarantees)]
    events = jobs.load_events(spark, specs).drop(*jobs.UNREAD_COLUMNS)
    cached: list = []

    def prepare():
        raise RuntimeError("the history's footers disagree")

    with pytest.raises(RuntimeError, match="footers disagree"):
        jobs.build(spark, specs, events, prepare, cached, small=True)
    try:
        # A small check's table enters ``cached`` only once its checkpoint job is done: had ``build`` raised
        # without waiting, the job would still be running and ``cached`` empty.
        assert len(cached) == 1, cached
        assert cached[0].count() == 2 * 12  # the publishes: one row per message of each publisher
    finally:
        for df in cached:
            df.unpersist()
