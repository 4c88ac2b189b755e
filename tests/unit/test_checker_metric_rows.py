"""job/metrics.py: metric_rows: the per-bucket parts of each run total are summed on the driver, per run and key; every
other metric row passes through unchanged (a pure function: no Spark)."""

from __future__ import annotations

from spark_checkers.job.metrics import TOTAL_PART, metric_rows


def row(run_id, metric, key, value):
    return {"run_id": run_id, "metric": metric, "key": key, "value": value}


def test_parts_are_summed_per_run_and_key_and_series_rows_pass_through():
    rows = [row("a", TOTAL_PART, "published", 3.0), row("a", TOTAL_PART, "published", 4.0),
            row("a", TOTAL_PART, "acked", 2.0), row("b", TOTAL_PART, "published", 5.0),
            row("a", "acked_per_bucket", "0", 2.0), row("a", "count", "owed", 7.0)]
    out = metric_rows(rows)
    assert row("a", "count", "published", 7.0) in out
    assert row("a", "count", "acked", 2.0) in out
    assert row("b", "count", "published", 5.0) in out  # another run's parts are its own
    assert row("a", "acked_per_bucket", "0", 2.0) in out and row("a", "count", "owed", 7.0) in out
    assert not [r for r in out if r["metric"] == TOTAL_PART]
    assert len(out) == 5


def test_a_null_part_counts_as_nothing_and_no_parts_give_no_total():
    assert metric_rows([row("a", TOTAL_PART, "failed", None), row("a", TOTAL_PART, "failed", 1.0)]) == [
        row("a", "count", "failed", 1.0)]
    assert metric_rows([row("a", "latency_p50_ms", "3", 12.5)]) == [row("a", "latency_p50_ms", "3", 12.5)]
