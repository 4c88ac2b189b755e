"""The Will rules' explanations.  The rules are decided from the small side of the history in plain Python
(spark_checkers/wills.py, called by timeline.py): a few rows per connection, no Spark table."""

from __future__ import annotations

from typing import Any

from spark_checkers.rules.registry import explains
from spark_checkers.rules.words import seconds
from spark_checkers.timeline import Timeline


def _connection(w: dict[str, Any], o: int) -> str:
    delay = f" with a Will Delay of {w['delay_s']} s" if w.get("delay_s") else ""
    return f"{w.get('client')}'s connection of {seconds(w.get('t_connect'), o)} (Will {w.get('payload')!r}{delay})"


def _end(w: dict[str, Any], o: int) -> str:
    how = {"harness": "cut without DISCONNECT", "server": "closed by the server side",
           "client": "ended by a normal DISCONNECT"}.get(w.get("initiator") or "", "ended")
    return f"{how} at {seconds(w.get('t_end'), o)}"


@explains("will.missing")
def _missing(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    if w.get("late"):
        arrived = (f"its Will arrived only at {seconds(w.get('t'), o)}, later than the "
                   f"{(w.get('wait_us') or 0) / 1e6:.1f} s a broker may take after that")
    else:
        arrived = (f"no Will of it reached the watcher in the {(w.get('wait_us') or 0) / 1e6:.3f} s from then to the "
                   "end of the history")
    return (f"{_connection(w, o)} was {_end(w, o)}; its Will was due at {seconds(w.get('t_due'), o)} but {arrived} "
            "[MQTT-3.1.2-8], [MQTT-3.1.3-9].")


@explains("will.after_normal_disconnect")
def _after_normal(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    return (f"{_connection(w, o)} was {_end(w, o)}, which discards the Will, yet {w.get('watcher')} received it at "
            f"{seconds(w.get('t'), o)} [MQTT-3.1.2-10].")


@explains("will.early")
def _early(w: dict[str, Any], timeline: Timeline) -> str:
    o = timeline.t_first
    head = f"{w.get('watcher')} received the Will of {_connection(w, o)} at {seconds(w.get('t'), o)}"
    why = w.get("why")
    if why == "still_connected":
        return f"{head}, while that connection was still open: a Will is published only once it ends [MQTT-3.1.2-8]."
    if why == "resumed":
        return (f"{head}; the connection was {_end(w, o)} and the session resumed at {seconds(w.get('t_next'), o)}, "
                "within the Will Delay: the Will must then never be sent [MQTT-3.1.3-9].")
    return (f"{head}; the connection was {_end(w, o)}, so the Will was due at {seconds(w.get('t_due'), o)}: "
            f"{((w.get('t_due') or 0) - (w.get('t') or 0)) / 1e6:.3f} s early, more than the "
            f"{(w.get('tol_us') or 0) // 1000} ms clock tolerance, while the session lived [MQTT-3.1.3-9].")
