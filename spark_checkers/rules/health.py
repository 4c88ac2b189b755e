"""The target's health: a node that exited outside every planned fault (health.unplanned_exit, found by
timeline.py from the harness's "exited" node events), in words with its last log lines."""

from __future__ import annotations

from typing import Any

from spark_checkers.rules.registry import explains
from spark_checkers.rules.words import seconds
from spark_checkers.timeline import Timeline


@explains("health.unplanned_exit")
def _unplanned_exit(w: dict[str, Any], timeline: Timeline) -> str:
    tail = [line for line in (w.get("log_tail") or []) if line.strip()][-3:]
    last = "; its last log lines: " + " | ".join(line.strip()[:160] for line in tail) if tail else "; its log is empty"
    return (f"node {w.get('node')} exited at {seconds(w.get('t'), timeline.t_first)} with exit status "
            f"{w.get('exit_status')}, while no fault of the plan was stopping or killing it{last}.")
