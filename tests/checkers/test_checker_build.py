"""How ``build.build`` runs its jobs: the driver's small tables are local relations (no Python worker processes),
a table materialised beside the main thread is handed over even when the main thread fails, and the names the
Spark side carries as codes are named again in every witness."""

from __future__ import annotations

import pytest

from spark_checkers import synthetic as s

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


def test_a_driver_table_is_a_local_relation_with_the_rows_given(spark):
    """``local_frame`` keeps every row and value (nested arrays of structs, nulls, empty arrays), and in a classic
    session the plan is a local relation: ``createDataFrame`` of a list made a Python RDD, whose every job ran
    Python worker processes."""
    from pyspark.sql import types as T

    from spark_checkers.job.events import local_frame

    L, S = T.LongType(), T.StringType()
    schema = T.StructType([
        T.StructField("run_id", S), T.StructField("seqs", T.ArrayType(L)),
        T.StructField("spans", T.ArrayType(T.StructType([T.StructField("s", L), T.StructField("e", L)]))),
        T.StructField("limit", T.IntegerType()), T.StructField("persistent", T.BooleanType())])
    rows = [("r1", [1, 2], [(3, 4), (5, 6)], 10, True), ("r2", [], [], None, None)]
    df = local_frame(spark, rows, schema)
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
    from spark_checkers import build
    from spark_checkers.job import columns
    from spark_checkers.job.events import RunSpec, load_events
    from spark_checkers.loader import open_run

    spec = s.Spec(pairs=2, messages=12)
    run = open_run(s.write_spec(tmp_path / "run", spec))
    specs = [RunSpec(run.run_id, run.parts, run.guarantees)]
    events = load_events(spark, specs).drop(*columns.UNREAD_COLUMNS)
    cached: list = []

    def prepare():
        raise RuntimeError("the history's footers disagree")

    with pytest.raises(RuntimeError, match="footers disagree"):
        build.build(spark, specs, events, prepare, cached, small=True)
    try:
        # A small check's table enters ``cached`` only once its checkpoint job is done: had ``build`` raised
        # without waiting, the job would still be running and ``cached`` empty.
        assert len(cached) == 1, cached
        assert cached[0].count() == 2 * 12  # the publishes: one row per message of each publisher
    finally:
        for df in cached:
            df.unpersist()


ODD_NAMES = ["sub-1", "sub-10", "it's", "back\\slash", "ünïcode/топік", "", "a b", 'quo"te', "0123456789abcdef"]


def test_python_and_spark_give_a_name_the_same_code_and_the_witness_names_it_again(spark):
    """The side tables are coded in Python (``code_of``), the events in Spark (``coded``): the codes must agree
    for any name, and a witness value (``named``) must come back as the name, nested or not.  A null stays null."""
    from pyspark.sql import functions as F

    from spark_checkers.job import codes
    from spark_checkers.job.events import local_frame

    frame = local_frame(spark, [(n,) for n in ODD_NAMES] + [(None,)], "name string")
    rows = frame.select("name", codes.coded(F.col("name")).alias("code"),
                        codes.named(codes.coded(F.col("name"))).alias("carried")).collect()
    names = codes.Names.of(ODD_NAMES)
    for row in rows:
        assert row["code"] == codes.code_of(row["name"]), row
        assert names.decode(row["carried"]) == row["name"]
    witness = {"client": rows[0]["carried"], "gap": [{"publisher": rows[4]["carried"]}], "t": 5, "why": "plain"}
    assert names.decode(witness) == {"client": ODD_NAMES[0], "gap": [{"publisher": ODD_NAMES[4]}], "t": 5,
                                     "why": "plain"}
    assert names.unknown([witness]) == set()


def test_a_name_the_driver_does_not_know_is_looked_up_in_the_history(spark):
    """A coded value no small row, topic or node names (a phantom's publisher, a body hash) is found by one scan of
    the history's coded columns, and named in the witness like any other."""
    from pyspark.sql import functions as F

    from spark_checkers.job import codes
    from spark_checkers.job.events import local_frame

    events = local_frame(spark, [("sub-1", "ghost-7", "t/1", "broker-1", "00ff00ff00ff00ff")],
                              "client string, publisher string, topic string, node string, body_hash string")
    names = codes.Names.of(["sub-1", "t/1", "broker-1"])
    carried = codes.encode_events(events).select(*[codes.named(F.col(c)).alias(c) for c in codes.CODED]).first().asDict()
    assert names.unknown([carried]) == {codes.code_of("ghost-7"), codes.code_of("00ff00ff00ff00ff")}
    names.learn(codes.lookup_names(events, names.unknown([carried])))
    assert names.decode(carried) == {"client": "sub-1", "publisher": "ghost-7", "topic": "t/1", "node": "broker-1",
                                     "body_hash": "00ff00ff00ff00ff"}


def test_a_one_run_aggregate_groups_by_the_real_keys_and_sorts_its_rows_once(spark):
    """In a one-run check run_id is a literal in every row.  The per-message aggregate groups by the other keys
    and puts run_id back: the window's sort is the only one (Spark kept a literal grouping key, and sorted every
    row by it three more times), and the rows are the same as grouped with the literal."""
    from pyspark.sql import functions as F

    from spark_checkers.job import columns, messages

    rows = [(client, publisher, pub_seq, seq, seq % 3 == 0)
            for seq, (client, publisher, pub_seq) in enumerate(
                [(c, p, q) for c in (1, 2) for p in (7, 8) for q in (1, 2, 2, 3)], start=1)]
    slots = (spark.createDataFrame(rows, "client long, publisher long, pub_seq long, seq long, resend boolean")
             .select(F.lit("r1").alias("run_id"), "*", (F.col("seq") * 10).alias("t"),
                     (F.col("seq") % 5 + 1).cast("int").alias("packet_id"), F.lit(False).alias("dup"),
                     F.lit(0).alias("conn"), F.lit(3).cast("long").alias("node"), F.lit(4).cast("long").alias("topic"),
                     F.lit(1).alias("qos"), F.lit(1).alias("epoch"), F.lit(True).alias("stored"),
                     F.lit(False).alias("retain"),  # a history column: the order rule's streams are apart by it
                     F.col("pub_seq").alias("body_hash"), F.lit(None).cast("long").alias("remaining_expiry_s"),
                     (F.col("seq") % 2 == 0).alias("acked"), (F.col("seq") + 1).alias("next_seq"),
                     (F.col("seq") * 10 + 5).alias("next_t"))
             .repartition("client"))

    def per_message(constant):
        return messages.deliveries_per_message(slots, constant).sortWithinPartitions(*columns.SUBSCRIBER_MESSAGE)

    one_run, grouped_with_literal = per_message({"run_id": "r1"}), per_message(None)
    assert one_run.columns == grouped_with_literal.columns
    assert sorted(one_run.collect()) == sorted(grouped_with_literal.collect())
    assert {r["run_id"] for r in one_run.collect()} == {"r1"}
    if hasattr(one_run, "_jdf"):  # classic: the physical plan as planned
        def sorts(df):  # in the plan as first planned (after a run, the adaptive plan shows the final one too)
            return df._jdf.queryExecution().executedPlan().toString().split("== Initial Plan ==")[-1].count("Sort [")
        assert sorts(one_run) == 1, one_run._jdf.queryExecution().executedPlan().toString()
        assert sorts(grouped_with_literal) > 1  # the control: what the literal key cost


@pytest.mark.nightly  # for its time (about 55 s); the plan shapes themselves are judged in CI (test_checkers_anomalies.py)
def test_the_warm_up_checks_both_plan_shapes_and_finds_what_it_planted(spark, tmp_path):
    """``api.warm_up`` (`ordeal spark start --warm-up`) checks a run-sized history with the small plan and a bulk
    one with the big plan, the bulk one ``big_rounds`` times; each check finds exactly its planted anomalies, and
    its histories are gone afterwards.  No rounds at all is refused before anything is written."""
    from spark_checkers.api import WarmUpCheck, warm_up

    with pytest.raises(ValueError, match=r"big_rounds=0\): expected at least 1"):
        warm_up(spark, tmp_path, big_rounds=0)
    checks = warm_up(spark, tmp_path, big_events=200_000, big_rounds=2)
    assert [c.plan for c in checks] == ["small", "big", "big"]
    assert all(c.right for c in checks), checks
    assert checks[1].planted == {"durability.lost": 10, "order.out_of_order": 5}
    assert list(tmp_path.iterdir()) == []
    # A check that finds anything else (here: unknown) is not right.
    assert not WarmUpCheck("big", 1, 1.0, checks[1].planted, {**checks[1].planted, "unknown": 1}).right
    assert all(c.why_unknown == "" for c in checks)
