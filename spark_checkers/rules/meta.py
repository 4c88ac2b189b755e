"""The meta invariants' explanations: a fault whose evidence says it did not take effect (meta.fault_bit, found
by timeline.py).  The other meta invariants (a complete history, a checker error) are decided in api.py."""

from __future__ import annotations

from typing import Any

from spark_checkers.rules.registry import explains
from spark_checkers.rules.words import seconds
from spark_checkers.timeline import Timeline


@explains("meta.fault_bit")
def _fault_bit(w: dict[str, Any], timeline: Timeline) -> str:
    return (f"fault {w.get('fault_id')} ({w.get('fault_kind')} of {w.get('node')}) at "
            f"{seconds(w.get('t'), timeline.t_first)}: {w.get('evidence')}.")
