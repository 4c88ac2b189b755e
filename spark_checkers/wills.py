"""The Will rules, decided from the small side of a history in plain Python (no Spark): every connection whose
CONNECT carried a Will (its connect row's ``detail.will``), how it ended (the next disconnect row of the client),
whether its session resumed within the Will Delay (the next connect's session present), and the Wills the watcher
received (delivery rows on the will topics, ``detail.will`` = the payload naming the connection;
contracts/history_schema.py WILL_TOPIC_PREFIX).  The explanations are rules/will.py's.

- ``will.missing`` [MQTT-3.1.2-8], [MQTT-3.1.3-9]: a connection with a Will ended without the client's normal
  DISCONNECT (a cut socket, a server's close, a node killed under it), its session did not resume within the
  Will Delay, and no Will of that connection reached the watcher by the end of the history (if it was due more
  than the pipeline slack before that end), or only later than due + WILL_SLACK_S + the pipeline slack.
- ``will.after_normal_disconnect`` [MQTT-3.1.2-10]: a Will of a connection the client ended with a normal
  DISCONNECT reached the watcher.
- ``will.early`` [MQTT-3.1.3-9]: a Will reached the watcher before it was due (its connection's end + the Will
  Delay, or the end of the session if that came first) by more than the clock tolerance, or although the session
  resumed within the delay (then it is never due).

A session resumed within the clock tolerance of the moment its Will Delay ran out (either side) makes both
outcomes legal: the broker's clock may place that CONNECT on the other side of the due time, and its sweep for due
Wills runs periodically.  Such a Will is neither owed nor forbidden (``either`` in what was judged); one that
arrives is still judged early against the due time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from contracts.history_schema import WILL_TOPIC_PREFIX, Kind
from contracts.invariants import WILL_SLACK_S

WILL_INVARIANTS = ("will.missing", "will.after_normal_disconnect", "will.early")
NO_WILLS = "no connection of this run carried a Will ([workload] wills = 0): nothing to judge"


def _detail(row: dict) -> dict[str, Any]:
    try:
        value = json.loads(row.get("detail") or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def is_will_delivery(row: dict) -> bool:
    return row.get("kind") == Kind.DELIVERY and str(row.get("topic") or "").startswith(WILL_TOPIC_PREFIX)


@dataclass(frozen=True)
class WillConnection:
    """One connection that carried a Will, and what its end made of it."""

    client: str
    payload: str
    delay_s: int
    t_connect: int
    connect_seq: int
    t_end: int | None = None  # its disconnect row (None: still connected when the history ends)
    normal: bool = False  # ended by the client's normal DISCONNECT: the Will is discarded
    initiator: str | None = None
    # The next connect of the client within the delay: it resumed the session (session present 1: the Will is
    # never due) or began a new one (the old session ended there: the Will is due then).
    t_next: int | None = None
    resumed: bool = False
    # The next connect of the client if it resumed the session (session present 1), within the delay or not.
    t_resume: int | None = None

    def resumed_at_the_due_time(self, tolerance_us: int) -> bool:
        """The session resumed within ``tolerance_us`` of the moment the Will Delay ran out, before or after."""
        if self.t_end is None or self.normal or not self.delay_s or self.t_resume is None:
            return False
        return abs(self.t_resume - (self.t_end + self.delay_s * 1_000_000)) <= tolerance_us

    @property
    def t_due(self) -> int | None:
        """When the Will is due: the end + the Will Delay, or the session's end (a new session) if sooner."""
        if self.t_end is None or self.normal:
            return None
        due = self.t_end + self.delay_s * 1_000_000
        if self.t_next is not None and self.t_next < due:
            return None if self.resumed else self.t_next
        return due


def will_connections(rows: list[dict]) -> list[WillConnection]:
    """Every connection of the run whose CONNECT carried a Will (rows: the small rows, in seq order)."""
    by_client: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("kind") in (Kind.CONNECT, Kind.DISCONNECT) and row.get("client"):
            by_client.setdefault(row["client"], []).append(row)
    found: list[WillConnection] = []
    for client, client_rows in by_client.items():
        for i, row in enumerate(client_rows):
            will = _detail(row).get("will") if row["kind"] == Kind.CONNECT else None
            if not isinstance(will, dict) or not will.get("payload"):
                continue
            following = client_rows[i + 1:]
            if following and following[0]["kind"] == Kind.CONNECT:
                # replaced without a row of its own (harness/clients.py drop: a connect timeout): how it ended
                # is not in the history, so neither is whether its Will was owed
                continue
            end = following[0] if following else None
            after = following[1] if len(following) > 1 else None
            delay = int(will.get("delay_s") or 0)
            connection = WillConnection(client, str(will["payload"]), delay, row["t_mono_us"], row["seq"])
            if end is not None:
                normal = end.get("initiator") == "client" and not end.get("abrupt")
                reconnect = after is not None and after["kind"] == Kind.CONNECT
                within = reconnect and after["t_mono_us"] < end["t_mono_us"] + delay * 1_000_000
                connection = WillConnection(
                    client, connection.payload, delay, row["t_mono_us"], row["seq"], t_end=end["t_mono_us"],
                    normal=normal, initiator=end.get("initiator"),
                    t_next=after["t_mono_us"] if within else None, resumed=bool(within and after.get("session_present")),
                    t_resume=after["t_mono_us"] if reconnect and after.get("session_present") else None)
            found.append(connection)
    return found


def will_violations(rows: list[dict], tolerance_us: int, slack_us: int,
                    t_last: int) -> tuple[dict[str, list[dict]], dict[str, int]]:
    """(invariant -> witnesses, what was judged) of the Will rules over ``rows`` (the small rows with the will
    deliveries).  ``t_last``: the history's last time: a Will not yet due + slack by then is not judged missing."""
    connections = will_connections(rows)
    arrivals: dict[str, list[dict]] = {}
    for row in rows:
        if is_will_delivery(row):
            payload = _detail(row).get("will")
            arrivals.setdefault(str(payload), []).append(row)
    violations: dict[str, list[dict]] = {}
    judged = {"connections": len(connections), "owed": 0, "forbidden": 0, "arrived": 0, "undecided": 0, "either": 0}
    wait_us = WILL_SLACK_S * 1_000_000 + slack_us
    for c in connections:
        got = sorted(arrivals.get(c.payload, []), key=lambda r: r["t_mono_us"])
        base = {"client": c.client, "payload": c.payload, "delay_s": c.delay_s, "t_connect": c.t_connect,
                "t_end": c.t_end, "initiator": c.initiator, "t_next": c.t_next, "resumed": c.resumed}
        first = got[0] if got else None
        if first is not None:
            judged["arrived"] += 1
            base.update(t=first["t_mono_us"], watcher=first.get("client"), arrivals=len(got))
        if c.t_end is None:
            if first is not None and first["t_mono_us"] < c.t_connect:
                continue  # a Will of an earlier history cannot be; judged by its own connection
            if first is not None:  # a Will of a connection still open
                violations.setdefault("will.early", []).append({**base, "why": "still_connected"})
            continue
        if c.normal:
            judged["forbidden"] += 1
            if first is not None:
                violations.setdefault("will.after_normal_disconnect", []).append(base)
            continue
        if c.resumed_at_the_due_time(tolerance_us):
            # resumed at the due time, within the clock tolerance: published or cancelled, both legal; an
            # arrival is still judged against the due time
            judged["either"] += 1
            due = c.t_end + c.delay_s * 1_000_000
            if first is not None and first["t_mono_us"] < due - tolerance_us:
                violations.setdefault("will.early", []).append({**base, "t_due": due, "why": "before_due",
                                                                "tol_us": tolerance_us})
            continue
        due = c.t_due
        if due is None:  # the session resumed within the delay: never due
            if first is not None:
                violations.setdefault("will.early", []).append({**base, "why": "resumed"})
            continue
        judged["owed"] += 1
        base["t_due"] = due
        if first is None:
            # Absent: judged against the end of the history (the drain waited until nothing more arrived), as a
            # lost message is; a Will due too close to that end is not judged (``undecided``).
            if due + slack_us <= t_last:
                violations.setdefault("will.missing", []).append({**base, "wait_us": t_last - due})
            else:
                judged["undecided"] += 1
            continue
        if first["t_mono_us"] < due - tolerance_us:
            violations.setdefault("will.early", []).append({**base, "why": "before_due", "tol_us": tolerance_us})
        elif first["t_mono_us"] > due + wait_us:
            violations.setdefault("will.missing", []).append({**base, "wait_us": wait_us, "late": True})
    return violations, judged
