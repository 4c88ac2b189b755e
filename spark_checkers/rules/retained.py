"""The retained-message rule's explanation.  The rule is decided from the small side of the history in plain
Python (spark_checkers/retained.py, called by timeline.py)."""

from __future__ import annotations

from typing import Any

from spark_checkers.rules.registry import explains
from spark_checkers.rules.words import seconds
from spark_checkers.timeline import Timeline


@explains("retained.not_last")
def _not_last(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    head = (f"{w.get('client')} subscribed to {w.get('filter')} (SUBACK at {seconds(w.get('t_subscribe'), o)}, on the "
            f"connection of {seconds(w.get('t_connect'), o)}) after {w.get('newest_publisher')}#{w.get('newest_pub_seq')}"
            f", retained on {w.get('topic')}, was acknowledged at {seconds(w.get('newest_t_ack'), o)}")
    if w.get("why") == "none":
        return (f"{head}, yet it received no retained message of {w.get('topic')} on that connection up to "
                f"{seconds(w.get('t_end'), o)} [MQTT-3.3.1-6], [MQTT-3.3.1-8].")
    return (f"{head}, yet its retained copy of {w.get('topic')}, at {seconds(w.get('t'), o)}, was "
            f"{w.get('publisher')}#{w.get('pub_seq')}, acknowledged at {seconds(w.get('t_ack'), o)}, before the newer "
            f"one was even published ({seconds(w.get('newest_t_invoke'), o)}): the newer one replaces it "
            "[MQTT-3.3.1-5].")
