"""The message side of a history: each publish as one message (``Publish``), each delivery with what its
packet-id slot says (``Delivery``), and each delivered (subscriber, message) with all its deliveries
(``Received``).

Identity is the payload's (publisher, pub_seq), never the packet id (docs/invariants.md "Identity").  A
packet id names a slot of the subscriber: a delivery's slot neighbours are the rows of the same client and
packet id (its deliveries and the acks it sent), in seq order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contracts.history_schema import WILL_TOPIC_PREFIX, Kind
from oracle.sessions import Life

PUBLISH_KINDS = (Kind.PUBLISH_INVOKE, Kind.PUBLISH_ACK, Kind.PUBLISH_FAIL, Kind.PUBLISH_INDETERMINATE)


@dataclass
class Publish:
    publisher: str
    pub_seq: int
    invokes: int = 0
    t_invoke: int | None = None
    topic: str | None = None
    qos: int | None = None
    expiry_s: int | None = None
    body_hash: str | None = None
    protocol: int | None = None
    props: str | None = None
    retain: bool | None = None
    t_ack: int | None = None
    t_fail: int | None = None
    t_indet: int | None = None

    @property
    def t_arr(self) -> int | None:
        """When the message reached the broker for the queue's order: its ack, else its invoke."""
        return self.t_ack if self.t_ack is not None else self.t_invoke


def publishes(rows: tuple[dict[str, Any], ...]) -> dict[tuple[str, int], Publish]:
    """One Publish per (publisher, pub_seq) of the publisher-side rows (publisher: the row's, else its client)."""
    out: dict[tuple[str, int], Publish] = {}
    for row in rows:
        if row["kind"] not in PUBLISH_KINDS or row.get("pub_seq") is None:
            continue
        publisher = row.get("publisher") if row.get("publisher") is not None else row.get("client")
        p = out.setdefault((publisher, row["pub_seq"]), Publish(publisher, row["pub_seq"]))
        t = row["t_mono_us"]
        if row["kind"] == Kind.PUBLISH_INVOKE:
            p.invokes += 1
            p.t_invoke = t if p.t_invoke is None else min(p.t_invoke, t)
            # Several invokes of one message carry the same publish; the largest of each, as one value.
            for name, column in (("topic", "topic"), ("qos", "qos"), ("expiry_s", "expiry_s"),
                                 ("body_hash", "body_hash"), ("protocol", "protocol"), ("props", "props"),
                                 ("retain", "retain")):
                value = row.get(column)
                if value is not None and (getattr(p, name) is None or value > getattr(p, name)):
                    setattr(p, name, value)
        else:
            name = {Kind.PUBLISH_ACK: "t_ack", Kind.PUBLISH_FAIL: "t_fail",
                    Kind.PUBLISH_INDETERMINATE: "t_indet"}[row["kind"]]
            if getattr(p, name) is None or t < getattr(p, name):
                setattr(p, name, t)
    return out


@dataclass
class Delivery:
    row: dict[str, Any]
    conn: int  # connects of the client before it
    epoch: int  # sessions of the client begun before it
    prev: dict[str, Any] | None = None  # the row before it in its packet-id slot (a delivery or an ack)
    next: dict[str, Any] | None = None  # the row after it in its slot
    prev_epoch: int | None = None
    prev_conn: int | None = None
    holder: dict[str, Any] | None = None  # the last delivery before it in its slot (acks between or not)

    @property
    def seq(self) -> int:
        return self.row["seq"]

    @property
    def t(self) -> int:
        return self.row["t_mono_us"]

    @property
    def key(self) -> tuple[str | None, int | None]:
        return self.row.get("publisher"), self.row.get("pub_seq")

    @property
    def qos(self) -> int:
        return self.row.get("qos") or 0

    @property
    def acked(self) -> bool | None:
        """The next row of its slot is the subscriber's ack; None: nothing follows in the slot."""
        return None if self.next is None else self.next["kind"] == Kind.DELIVERY_ACK_SENT

    @property
    def _slot_held(self) -> bool:
        """The slot's previous row is a delivery of this session not yet acknowledged (and this one needs an id)."""
        return (self.prev is not None and self.prev["kind"] == Kind.DELIVERY and self.prev_epoch == self.epoch
                and self.qos > 0 and self.row.get("packet_id") is not None)

    @property
    def resend(self) -> bool:
        """The same message again in a slot that still held it unacknowledged."""
        return self._slot_held and (self.prev.get("publisher"), self.prev.get("pub_seq")) == self.key

    @property
    def reused(self) -> bool:
        """Another message in a slot that still held one unacknowledged."""
        return self._slot_held and (self.prev.get("publisher"), self.prev.get("pub_seq")) != self.key


def is_will_flow(row: dict[str, Any]) -> bool:
    """A row of the watcher's Will flow: a delivery on a will topic, or its ack (contracts/history_schema.py
    WILL_TOPIC_PREFIX)."""
    return (row["kind"] in (Kind.DELIVERY, Kind.DELIVERY_ACK_SENT, Kind.QOS2_RECEIVED)
            and str(row.get("topic") or "").startswith(WILL_TOPIC_PREFIX))


def deliveries(rows: tuple[dict[str, Any], ...], lives: dict[str, Life]) -> list[Delivery]:
    """Every delivery row with its slot neighbours, in seq order."""
    slots: dict[tuple[str, int | None], list[dict[str, Any]]] = {}
    for row in rows:
        if row["kind"] in (Kind.DELIVERY, Kind.DELIVERY_ACK_SENT):
            slots.setdefault((row.get("client"), row.get("packet_id")), []).append(row)
    out: dict[int, Delivery] = {}
    for (client, _), slot in slots.items():
        life = lives.get(client) or Life(client)
        for i, row in enumerate(slot):
            if row["kind"] != Kind.DELIVERY:
                continue
            prev = slot[i - 1] if i > 0 else None
            holder = next((r for r in reversed(slot[:i]) if r["kind"] == Kind.DELIVERY), None)
            out[row["seq"]] = Delivery(
                row, life.conn_index(row["seq"]), life.epoch(row["seq"]), prev,
                slot[i + 1] if i + 1 < len(slot) else None,
                life.epoch(prev["seq"]) if prev is not None else None,
                life.conn_index(prev["seq"]) if prev is not None else None, holder)
    return [out[s] for s in sorted(out)]


@dataclass
class Received:
    """Every delivery of one message to one subscriber, in seq order."""

    client: str
    publisher: str | None
    pub_seq: int | None
    all: list[Delivery] = field(default_factory=list)

    @property
    def first(self) -> Delivery:
        return self.all[0]

    @property
    def last(self) -> Delivery:
        return self.all[-1]

    @property
    def t_first(self) -> int:
        return self.first.t

    @property
    def t_last(self) -> int:
        return max(d.t for d in self.all)

    @property
    def qos(self) -> int:
        return max(d.qos for d in self.all)

    def acks(self) -> list[dict[str, Any]]:
        """The ack rows that acknowledged one of its deliveries (each delivery's next slot row, if an ack)."""
        return [d.next for d in self.all if d.acked]

    @property
    def first_ack(self) -> dict[str, Any] | None:
        acks = self.acks()
        return min(acks, key=lambda a: a["seq"]) if acks else None

    @property
    def first_ack_t(self) -> int | None:
        acks = self.acks()
        return min(a["t_mono_us"] for a in acks) if acks else None


def received(all_deliveries: list[Delivery]) -> dict[tuple[str, str | None, int | None], Received]:
    out: dict[tuple[str, str | None, int | None], Received] = {}
    for d in all_deliveries:
        key = (d.row.get("client"), *d.key)
        out.setdefault(key, Received(*key)).all.append(d)
    return out
