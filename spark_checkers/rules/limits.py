"""The limit rule over each settled offline backlog (black box): no more of it delivered than the queue limit
allows.  How a trimmed message's loss is judged (trimmed under the limit, the wrong end trimmed) is a loss rule's
(losses.py)."""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F

from spark_checkers.rules.columns import client
from spark_checkers.rules.registry import BACKLOGS, explains, rule
from spark_checkers.rules.words import seconds
from spark_checkers.timeline import Timeline


# More of one settled backlog (acked before reconnect - slack) delivered than the limit allows.
@rule("limits.over_limit", BACKLOGS)
def over_limit():
    return (F.col("n_settled_delivered") > F.col("limit"), F.col("k.c") - F.col("t_origin"),
            client(), F.col("k.c").alias("t"), F.col("k.d").alias("t_offline"),
            F.col("n_settled_delivered").alias("kept"), "limit", "n_backlog", "n_settled",
            F.col("n_pipeline_w").alias("n_in_pipeline"), "slack_us", "t_origin",
            F.lit("black box: delivered after reconnect").alias("source"))


@explains("limits.over_limit")
def _over_limit(w: dict[str, Any], timeline: Timeline) -> str:
    return (f"{w.get('client')}: {w.get('kept')} messages kept/delivered where the limit is {w.get('limit')} "
            f"({w.get('source')}, at {seconds(w.get('t'), timeline.t_first)}).")
