"""Each client's life, walked row by row in seq order: its connections, sessions, subscriptions and offline
windows (docs/invariants.md "Owed", rules 3 and 6; "A discarded session's messages"), and the sessions the
broker lost or brought back at a reconnect.

Persistent session (docs/invariants.md, "Declared guarantees"): MQTT 3.1.1 CleanSession = 0, or MQTT 5 clean
start 0 or session expiry > 0.  An MQTT 5 session ends ``session_expiry_s`` after its disconnect (0 or
absent: the broker keeps it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contracts.history_schema import Kind
from oracle.run import NEVER, detail

REFUSED = 0x80  # a CONNACK / SUBACK reason code from here on refuses


@dataclass(frozen=True)
class Subscription:
    client: str
    topic_filter: str
    granted: int
    t_from: int
    t_to: int | None  # None: held to the end of the history
    persistent: bool  # the session that held it, when it ended
    sub_id: int | None = None  # its SUBSCRIBE's Subscription Identifier (subscribe_ack detail)
    rap: bool = False  # its SUBSCRIBE's Retain As Published


@dataclass(frozen=True)
class Window:
    """Offline from ``d`` (its disconnect) to ``c`` (the reconnect; NEVER: none came).  ``discarded``: the
    session ended at ``c`` (clean start, or its MQTT 5 expiry elapsed), and its queue with it."""

    idx: int
    d: int
    c: int
    discarded: bool


@dataclass
class Life:
    client: str
    connect_seqs: list[int] = field(default_factory=list)  # every connect row, refused or not
    accepted: list[dict[str, Any]] = field(default_factory=list)  # accepted connect rows
    fresh_seqs: list[int] = field(default_factory=list)  # accepted connects without session present
    persistent_fresh_seqs: list[int] = field(default_factory=list)
    disconnects: list[tuple[int, int]] = field(default_factory=list)  # (seq, t)
    windows: list[Window] = field(default_factory=list)
    new_sessions: list[dict[str, Any]] = field(default_factory=list)  # {seq, t, why}
    lost: list[dict[str, Any]] = field(default_factory=list)  # session present 0 where it had to be 1
    returned: list[dict[str, Any]] = field(default_factory=list)  # a lost session presented again

    def conn_index(self, seq: int) -> int:
        """How many connects came before ``seq``: the connection a row at ``seq`` arrived on."""
        return sum(1 for s in self.connect_seqs if s < seq)

    def epoch(self, seq: int) -> int:
        """How many sessions had begun before ``seq`` (accepted connects without session present)."""
        return sum(1 for s in self.fresh_seqs if s < seq)


def persistent(row: dict[str, Any]) -> bool:
    if row.get("clean_start") is False:
        return True
    return row.get("protocol") == 5 and (row.get("session_expiry_s") or 0) > 0


def walk(client: str, rows: list[dict[str, Any]], subscriptions: list[Subscription]) -> Life:
    """One client's connect / disconnect / subscribe / unsubscribe rows (seq order) into its Life; the
    subscriptions it held are appended to ``subscriptions``."""
    life = Life(client)
    held: dict[str, tuple[int, int, int | None, bool]] = {}  # filter -> (t_from, granted, sub_id, rap)
    is_persistent = False
    expiry: int | None = None
    went: dict[str, Any] | None = None  # the disconnect that ended the last connection, while offline
    online = False
    had_session = False
    pending_loss: dict[str, Any] | None = None  # a lost session that may still come back

    def end(topic_filter: str, t_end: int | None) -> None:
        t_from, granted, sub_id, rap = held.pop(topic_filter)
        subscriptions.append(Subscription(client, topic_filter, granted, t_from, t_end, is_persistent, sub_id, rap))

    def end_all(t_end: int | None) -> None:
        for topic_filter in list(held):
            end(topic_filter, t_end)

    for row in rows:
        kind, t, seq = row["kind"], row["t_mono_us"], row["seq"]
        if kind == Kind.CONNECT:
            life.connect_seqs.append(seq)
            if (row.get("reason_code") or 0) >= REFUSED:
                continue
            life.accepted.append(row)
            was_persistent, old_expiry = is_persistent, expiry
            expired = (went is not None and old_expiry is not None and old_expiry > 0
                       and t - went["t_mono_us"] > old_expiry * 1_000_000)
            if went is not None:
                life.windows.append(Window(len(life.windows), went["t_mono_us"], t,
                                           expired or row.get("clean_start") is True))
            if expired:
                end_all(went["t_mono_us"])
            if row.get("clean_start") is True or (pending_loss is not None and _over(pending_loss, t)):
                pending_loss = None
            if (row.get("clean_start") is False and was_persistent and not expired and went is not None
                    and row.get("session_present") is False):
                loss = {"client": client, "seq": seq, "t": t, "t_disconnect": went["t_mono_us"]}
                life.lost.append(loss)
                if pending_loss is None:
                    pending_loss = {"losses": [loss], "held": dict(held), "window": len(life.windows) - 1,
                                    "t_disconnect": went["t_mono_us"], "expiry": old_expiry}
                else:
                    pending_loss["losses"].append(loss)
            elif pending_loss is not None and row.get("session_present") is True:
                _came_back(life, row, pending_loss, held, subscriptions)
                pending_loss = None
            why = None
            if had_session:
                if row.get("clean_start") is True:
                    why = "clean_start"
                elif row.get("session_present") is True:
                    why = None
                elif expired:
                    why = "expired"
                elif not was_persistent:
                    why = "after_clean"
            if why is not None:
                life.new_sessions.append({"seq": seq, "t": t, "why": why})
            if row.get("session_present") is not True:
                life.fresh_seqs.append(seq)
                if persistent(row):
                    life.persistent_fresh_seqs.append(seq)
                end_all(t)
            is_persistent, had_session = persistent(row), True
            expiry = row.get("session_expiry_s") if row.get("protocol") == 5 else None
            online, went = True, None
        elif kind == Kind.DISCONNECT:
            life.disconnects.append((seq, t))
            if online:
                online, went = False, row
                if not is_persistent:
                    end_all(t)
        elif kind == Kind.SUBSCRIBE_ACK and row.get("topic"):
            # Refused: a reason code from 0x80 on, in reason_code or (as the schema once said) in qos.
            refused = (row.get("reason_code") or 0) >= REFUSED or (row.get("qos") or 0) >= REFUSED
            topic_filter = row["topic"]
            if topic_filter in held:  # a subscribe again replaces the subscription from now on
                end(topic_filter, t)
            if not refused:
                options = detail(row)
                sub_id = options.get("sub_id")
                held[topic_filter] = (t, row.get("qos") or 0,
                                      sub_id if isinstance(sub_id, int) and not isinstance(sub_id, bool) else None,
                                      options.get("rap") is True)
                pending_loss = None  # a session of its own now: a session present later is that one
        elif kind == Kind.UNSUBSCRIBE_ACK and row.get("topic") in held:
            end(row["topic"], t)
    if went is not None:
        life.windows.append(Window(len(life.windows), went["t_mono_us"], NEVER, False))
    end_all(None)
    return life


def _over(loss: dict[str, Any], t: int) -> bool:
    """The lost session's own MQTT 5 expiry had elapsed by ``t``: nothing of it can come back."""
    expiry = loss["expiry"]
    return expiry is not None and expiry > 0 and t - loss["t_disconnect"] > expiry * 1_000_000


def _came_back(life: Life, row: dict[str, Any], loss: dict[str, Any], held: dict[str, tuple],
               subscriptions: list[Subscription]) -> None:
    """A session reported lost is presented again: the broker kept it all along.  Its subscriptions are held
    without a break, and its offline windows since the loss's disconnect are one window ending here."""
    first = loss["losses"][0]
    for topic_filter, (t_from, granted, sub_id, rap) in loss["held"].items():
        ended = Subscription(life.client, topic_filter, granted, t_from, first["t"], True, sub_id, rap)
        if ended in subscriptions and topic_filter not in held:
            subscriptions.remove(ended)
            held[topic_filter] = (t_from, granted, sub_id, rap)
    start = loss["window"]
    if 0 <= start < len(life.windows):
        d = life.windows[start].d
        del life.windows[start:]
        life.windows.append(Window(start, d, row["t_mono_us"], False))
    life.returned.append({"client": life.client, "seq": row["seq"], "t": row["t_mono_us"],
                          "lost_at": [x["seq"] for x in loss["losses"]]})
