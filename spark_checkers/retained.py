"""The retained-message rule, decided from the small side of a history in plain Python (no Spark): the retained
publishes (publish_invoke rows with ``retain`` on the retained topics, contracts/history_schema.py
RETAINED_TOPIC_PREFIX, and their outcomes), the subscriptions to them (subscribe_ack rows, after the connect that
sent them), and the deliveries with RETAIN 1 on those topics.  The explanation is rules/retained.py's.

``retained.not_last`` [MQTT-3.3.1-5], [MQTT-3.3.1-6], [MQTT-3.3.1-8]: a new subscription to a retained topic
(MQTT 5 Retain Handling 0, the workload's) receives, on the connection that subscribed, as its RETAIN 1 copy of
that topic a message older than the newest retained message acknowledged before the subscribe, or none while
one was.  "Before the subscribe": its publish_ack precedes the connect row of the subscribing connection (its
SUBSCRIBE left after that CONNACK; the reference broker stores a retained message before its PUBACK).  "Older":
its acknowledgement precedes the newest one's publish (two retained publishes in flight at once may be stored in
either order).  The workload deletes nothing (no zero-byte payload: [MQTT-3.3.1-10] is not exercised).
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts.history_schema import RETAINED_TOPIC_PREFIX, Kind
from contracts.topics import filter_matches

RETAINED_INVARIANTS = ("retained.not_last",)
NO_RETAINED = ("no subscription of this run was made to a retained topic after a retained publish was acknowledged "
               "([workload] retained = 0): nothing to judge")
RETAINED_KINDS = (Kind.PUBLISH_INVOKE, Kind.PUBLISH_ACK, Kind.DELIVERY)


def on_retained_topic(row: dict) -> bool:
    return str(row.get("topic") or "").startswith(RETAINED_TOPIC_PREFIX)


@dataclass(frozen=True)
class RetainedPublish:
    publisher: str
    pub_seq: int
    topic: str
    t_invoke: int
    t_ack: int | None


def retained_publishes(rows: list[dict]) -> dict[tuple[str, int], RetainedPublish]:
    invokes = {(r["publisher"], r["pub_seq"]): r for r in rows
               if r["kind"] == Kind.PUBLISH_INVOKE and r.get("retain") and on_retained_topic(r) and r.get("publisher")}
    acks = {(r.get("publisher"), r.get("pub_seq")): r["t_mono_us"] for r in rows if r["kind"] == Kind.PUBLISH_ACK}
    return {key: RetainedPublish(key[0], key[1], r["topic"], r["t_mono_us"], acks.get(key)) for key, r in invokes.items()}


def retained_violations(rows: list[dict], slack_us: int, t_last: int) -> tuple[dict[str, list[dict]], dict[str, int]]:
    """(invariant -> witnesses, what was judged) over ``rows`` (the small rows with the retained publishes and the
    RETAIN 1 deliveries, in seq order)."""
    published = retained_publishes(rows)
    topics = sorted({p.topic for p in published.values()})
    judged = {"retained_publishes": len(published), "subscriptions": 0, "judged": 0, "undecided": 0}
    violations: dict[str, list[dict]] = {}
    by_client: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("client") and row["kind"] in (Kind.CONNECT, Kind.DISCONNECT, Kind.SUBSCRIBE_ACK, Kind.DELIVERY):
            by_client.setdefault(row["client"], []).append(row)
    for client, client_rows in by_client.items():
        t_connect = None
        for i, row in enumerate(client_rows):
            if row["kind"] == Kind.CONNECT:
                t_connect = row["t_mono_us"]
            if row["kind"] != Kind.SUBSCRIBE_ACK or row.get("qos") is None or t_connect is None:
                continue
            matched = [t for t in topics if filter_matches(str(row.get("topic")), t)]
            if not matched:
                continue
            judged["subscriptions"] += 1
            # this connection's rows after the SUBACK, up to its end
            after = []
            for later in client_rows[i + 1:]:
                if later["kind"] in (Kind.CONNECT, Kind.DISCONNECT):
                    break
                after.append(later)
            t_end = next((r["t_mono_us"] for r in client_rows[i + 1:] if r["kind"] in (Kind.CONNECT, Kind.DISCONNECT)),
                         t_last)
            for topic in matched:
                before = [p for p in published.values() if p.topic == topic and p.t_ack is not None
                          and p.t_ack < t_connect]
                if not before:
                    continue
                newest = max(before, key=lambda p: p.t_invoke)
                copies = [r for r in after if r["kind"] == Kind.DELIVERY and r.get("retain") and r.get("topic") == topic]
                base = {"client": client, "topic": topic, "filter": row.get("topic"), "t_connect": t_connect,
                        "t_subscribe": row["t_mono_us"], "newest_publisher": newest.publisher,
                        "newest_pub_seq": newest.pub_seq, "newest_t_ack": newest.t_ack}
                if not copies:
                    if t_end - row["t_mono_us"] < slack_us:
                        judged["undecided"] += 1  # the connection ended too soon after its SUBACK to tell
                        continue
                    judged["judged"] += 1
                    violations.setdefault("retained.not_last", []).append({**base, "why": "none", "t_end": t_end})
                    continue
                judged["judged"] += 1
                first = copies[0]
                got = published.get((first.get("publisher"), first.get("pub_seq")))
                if got is not None and got.t_ack is not None and got.t_ack < newest.t_invoke:
                    violations.setdefault("retained.not_last", []).append(
                        {**base, "why": "older", "t": first["t_mono_us"], "publisher": got.publisher,
                         "pub_seq": got.pub_seq, "t_ack": got.t_ack, "newest_t_invoke": newest.t_invoke})
    return violations, judged
