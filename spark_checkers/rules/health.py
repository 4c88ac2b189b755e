"""The target's health, in words with each node's last log lines: a node that exited outside every planned
fault (health.unplanned_exit) and a broker node that stopped answering the run's health probe outside every
planned fault (health.unresponsive); both found by timeline.py from the harness's node events
(harness/death_watch.py)."""

from __future__ import annotations

from typing import Any

from spark_checkers.rules.registry import explains
from spark_checkers.rules.words import seconds
from spark_checkers.timeline import Timeline


def _last_lines(w: dict[str, Any]) -> str:
    tail = [line for line in (w.get("log_tail") or []) if line.strip()][-3:]
    return "; its last log lines: " + " | ".join(line.strip()[:160] for line in tail) if tail else "; its log is empty"


@explains("health.unplanned_exit")
def _unplanned_exit(w: dict[str, Any], timeline: Timeline) -> str:
    return (f"node {w.get('node')} exited at {seconds(w.get('t'), timeline.t_first)} with exit status "
            f"{w.get('exit_status')}, while no fault of the plan was stopping or killing it{_last_lines(w)}.")


@explains("health.unresponsive")
def _unresponsive(w: dict[str, Any], timeline: Timeline) -> str:
    origin = timeline.t_first
    since = seconds(w.get("t_from"), origin)
    start = "" if w.get("t") == w.get("t_from") else f" (outside every planned fault from {seconds(w.get('t'), origin)})"
    until = ("and never answered again before the run ended" if w.get("t_to") is None
             else f"until {seconds(w.get('t_to'), origin)}")
    return (f"node {w.get('node')} stopped answering at {since}{start}, {until}: its probe ({w.get('probe')}) "
            f"failed with {w.get('error')!r} for longer than the {w.get('grace_s')} s grace while no fault of the "
            f"plan covered it{_last_lines(w)}.")
