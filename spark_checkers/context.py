"""The rows of the history around a witness, as an engineer would lay them out by hand to check it: the
subscriber's connects (clean start, session present) and disconnects, its deliveries (packet id, DUP) and
acks, and the faults active.  A bounded number per witness (report.json ``witnesses[].context``,
docs/report.md).  The deliveries and acks come from one Spark query over the history (spark_checkers/collect.py: ``collect_context``);
everything else from the timeline; the assembly here is plain Python."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spark_checkers.timeline import NEVER, Timeline

# Deliveries and acks kept per witness (the nearest to its times), and the margin around its times.
MESSAGE_ROWS = 16
MARGIN_US = 1_000_000
# Every time a witness may carry; the earliest and latest of them bound its window.
TIME_KEYS = ("t", "prev_t", "t_again", "t_redelivery", "first_ack_t", "after_t", "t_invoke", "t_ack", "t_offline",
             "t_reconnect", "t_last", "carried_from_offline", "t_disconnect", "t_session")


@dataclass(frozen=True)
class Window:
    """Where to look for one witness: its subscriber, its time span, and the message it is about."""

    client: str
    t_lo: int
    t_hi: int
    publisher: str | None
    pub_seq: int | None


def window_of(w: dict[str, Any]) -> Window | None:
    """The window of one raw witness, or None when it names no subscriber or no time (a fault's evidence)."""
    client = w.get("client")
    times = [int(w[k]) for k in TIME_KEYS if isinstance(w.get(k), int) and not isinstance(w.get(k), bool)
             and 0 <= w[k] < NEVER]
    if not isinstance(client, str) or not times:
        return None
    seq = w.get("first_seq", w.get("pub_seq"))
    return Window(client, min(times), max(times), w.get("publisher"), seq if isinstance(seq, int) else None)


def assemble(window: Window, messages: list[dict[str, Any]], timeline: Timeline) -> list[dict[str, Any]]:
    """The context rows of one witness in history order: ``messages`` (its deliveries and acks, already the
    nearest few) with the subscriber's connects and disconnects in the window (and the connect its window
    starts in), and the faults active in it."""
    o = timeline.t_first
    lo, hi = window.t_lo - MARGIN_US, window.t_hi + MARGIN_US
    rows: list[dict[str, Any]] = []

    def row(seq: int | None, t: int, kind: str, **fields: Any) -> None:
        rows.append({"seq": seq, "t_s": round((t - o) / 1e6, 6), "kind": kind, **fields})

    for m in messages:
        message = (f"{m['publisher']}#{m['pub_seq']}" if m.get("publisher") is not None else None)
        own = (m["kind"] == "delivery" and window.publisher is not None and m.get("publisher") == window.publisher
               and m.get("pub_seq") == window.pub_seq)
        row(m["seq"], m["t_mono_us"], "delivery" if m["kind"] == "delivery" else "ack", client=window.client,
            node=m.get("node"), packet_id=m.get("packet_id"), dup=m.get("dup") if m["kind"] == "delivery" else None,
            qos=m.get("qos"), message=message if m["kind"] == "delivery" else None, witness=own)
    connects = timeline.connects.get(window.client, [])
    # The connect the window starts in: which session, clean or not, the first rows belong to.
    opening = [c for c in connects if c["t_mono_us"] < lo]
    for c in ([opening[-1]] if opening else []) + [c for c in connects if lo <= c["t_mono_us"] <= hi]:
        refused = (c.get("reason_code") or 0) >= 0x80
        row(c["seq"], c["t_mono_us"], "connect", client=window.client, node=c.get("node"),
            clean_start=c.get("clean_start"), session_present=c.get("session_present"),
            note=(f"MQTT {'5' if c.get('protocol') == 5 else '3.1.1'}"
                  + (f", session expiry {c['session_expiry_s']} s" if c.get("session_expiry_s") is not None else "")
                  + (f", refused ({c.get('reason_code'):#x})" if refused else "")))
    for seq, t in timeline.disconnects.get(window.client, []):
        if lo <= t <= hi:
            row(seq, t, "disconnect", client=window.client)
    for f in timeline.faults:
        end = f.t_heal if f.t_heal is not None else NEVER
        if f.t_start <= hi and end >= lo:
            what = f"{f.kind} of {f.node or '?'} ({f.fault_id})"
            if f.t_start >= lo:
                row(None, f.t_start, "fault_start", node=f.node, note=what)
            else:
                row(None, lo, "fault_active", node=f.node, note=f"{what}, active since {(f.t_start - o) / 1e6:.3f} s")
            if f.t_heal is not None and f.t_heal <= hi:
                row(None, f.t_heal, "fault_heal", node=f.node, note=what)
    rows.sort(key=lambda r: (r["t_s"], -1 if r["seq"] is None else r["seq"]))
    keys = ("seq", "t_s", "kind", "client", "node", "message", "packet_id", "dup", "qos", "clean_start",
            "session_present", "note", "witness")
    return [{k: r.get(k) for k in keys} for r in rows]
