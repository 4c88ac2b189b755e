"""A check that Spark cannot finish is unknown, with the reason, never a pass: a corrupt data page, a task dying
mid-check, one broken rule (the others still answer).  Histories broken before Spark reads them:
tests/unit/test_checker_inputs.py."""

from __future__ import annotations

import pytest
from support.reports import all_unknown

from spark_checkers import build
from spark_checkers import synthetic as s
from spark_checkers.api import check_runs
from spark_checkers.job import sizing
from spark_checkers.rules import losses, registry
from spark_checkers.verdicts import FAIL, PASS, UNKNOWN

SPEC = s.Spec(pairs=1, messages=5)


@pytest.mark.spark
def test_corrupt_data_page_is_a_checker_error(spark, tmp_path):
    """The footer reads fine but the column data is garbage: Spark fails, the verdict is unknown."""
    run = s.write_spec(tmp_path / "run", s.Spec(pairs=1, messages=200), parts=1)
    part = run / "history" / "events-00000.parquet"
    data = bytearray(part.read_bytes())
    for offset in range(8, len(data) // 2):
        data[offset] = 0xFF
    part.write_bytes(bytes(data))
    report = check_runs([run], spark=spark)[0]
    assert report["exit_code"] == 2
    assert all(i["verdict"] == UNKNOWN for i in report["invariants"])
    assert "checker error" in report["invariants"][0]["reason"] or "Parquet" in report["invariants"][0]["reason"]


@pytest.mark.spark
@pytest.mark.timeout(900)  # Spark on a loaded 2-core machine
def test_a_spark_job_dying_mid_check_is_unknown_never_pass(spark, tmp_path, monkeypatch):
    """A task failure while the intermediate tables are materialised (as a localCheckpoint once did under
    load) must make every invariant unknown with the reason, and the next check must work again."""
    from pyspark.sql import functions as F

    original = build.publishes

    def dying(events, constant=None):
        boom = F.when(F.col("pub_seq") > 0, F.raise_error(F.lit("injected task failure")))
        return original(events, constant).withColumn("boom", boom)

    run = s.write_spec(tmp_path / "run", SPEC)
    monkeypatch.setattr(build, "publishes", dying)
    all_unknown(check_runs([run], spark=spark), "injected task failure")
    monkeypatch.setattr(build, "publishes", original)
    assert check_runs([run], spark=spark)[0]["exit_code"] == 0


@pytest.mark.spark
@pytest.mark.timeout(900)
# The big plan in the nightly tier (about 45 s apiece): CI breaks the same rules on the small plan.
@pytest.mark.parametrize("plan", [pytest.param(p, marks=pytest.mark.nightly) if p == "big" else p for p in sizing.PLANS])
@pytest.mark.parametrize("broken", ["order.packet_id_invalid", "durability.lost"])
def test_a_broken_rule_is_named_and_the_others_still_answer(spark, tmp_path, monkeypatch, broken, plan):
    """One rule breaking makes its invariant unknown with the error (named without running the broken query
    again: that once made every invariant unknown), and every other invariant is still judged, with the run's
    counts.  A big check collects the rules that read no open message in its aside thread (build.Checks.early)
    and the loss rules in the calling one: either side may break, and the fallback (Checks.parts, all_metrics)
    waits for the aside thread's rules and metrics."""
    from pyspark.sql import functions as F

    spec = s.Spec(pairs=2, messages=30)
    run = s.write_run(tmp_path / "run", s.drop_delivery(s.generate(spec), "sub-1", "pub-1", 7), spec)
    # The planted loss: "durability.lost" has a row to break on.
    assert {i["id"] for i in check_runs([run], spark=spark, plan=plan)[0]["invariants"] if i["verdict"] == FAIL} == {
        "durability.lost"}
    add, owed_checks = registry.Rules.add, build.owed_checks

    def breaking(self, invariant, condition, sort_key, *columns):  # the rule fails on every row it evaluates
        if invariant == broken:
            condition = condition | F.raise_error(F.lit("injected rule failure")).cast("boolean")
        return add(self, invariant, condition, sort_key, *columns)

    def breaking_loss(table, gaps):
        lost, metrics = owed_checks(table, gaps)
        if broken == "durability.lost":
            lost = lost.withColumn("witness", F.raise_error(F.lit("injected rule failure")).cast("string"))
        return lost, metrics

    monkeypatch.setattr(registry.Rules, "add", breaking)
    monkeypatch.setattr(build, "owed_checks", breaking_loss)
    report = check_runs([run], spark=spark, plan=plan)[0]
    verdicts = {i["id"]: i for i in report["invariants"]}
    assert report["exit_code"] == (2 if broken == "durability.lost" else 1)  # else the planted loss is found
    assert verdicts[broken]["verdict"] == UNKNOWN and "injected rule failure" in verdicts[broken]["reason"]
    # The loss rules are one query (each lost message under its cause): all of them are unknown with it.
    decided_by = set(losses.LOSS_INVARIANTS) if broken == "durability.lost" else {broken}
    unknown = {i for i, v in verdicts.items() if v["verdict"] == UNKNOWN}
    assert broken in unknown and unknown <= decided_by | {"meta.checker_error"}, unknown
    assert "injected rule failure" in verdicts["meta.checker_error"]["reason"]
    assert verdicts["order.out_of_order"]["verdict"] == PASS
    if broken != "durability.lost":
        assert verdicts["durability.lost"]["verdict"] == FAIL and verdicts["durability.lost"]["count"] == 1
    assert report["counts"]["published"] == 60 and report["counts"]["delivered_messages"] == 59
