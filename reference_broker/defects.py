"""The defect catalog: realistic bugs of this architecture, each off by default.

A scenario switches one on with ``defects = ["name"]`` in its ``[broker]`` table; the suite proves its
worth by catching each one with the invariant named here (ids from docs/architecture.md).
``needs_fault`` says whether the bug only shows when a fault (process kill, failover) happens; the
others show under plain traffic and client reconnects.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Defect:
    name: str
    what: str          # one line: what is wrong
    invariant: str     # the invariant id that must catch it
    needs_fault: bool  # only shows under a process/network fault
    where: str         # the part of the broker that carries it


_DEFECTS = (
    Defect("score_reset_at_wrap",
           "save script restarts the ZSET score at the packet id when the id wraps 65535 -> 1, so "
           "messages after the wrap sort before older ones",
           "order.out_of_order", False, "lua/save.lua"),
    Defect("packet_id_wraps_to_zero",
           "save script wraps the packet id 65535 -> 0 instead of 1 (0 is not a valid packet id)",
           "order.packet_id_invalid", False, "lua/save.lua"),
    Defect("last_packet_id_from_zset",
           "save script takes the last packet id from the ZSET only, so an empty queue restarts ids at 1 "
           "and {client}_last_packet_id falls behind the ids already handed out",
           "whitebox.last_packet_id_behind", False, "lua/save.lua"),
    Defect("trim_newest",
           "trimming over the limit deletes the newest messages instead of the oldest",
           "limits.trim_not_oldest", False, "lua/save.lua"),
    Defect("trim_off_by_one",
           "trimming compares with the limit off by one and keeps limit + 1 messages",
           "limits.over_limit", False, "lua/save.lua"),
    Defect("expiry_as_milliseconds",
           "the MQTT 5 message expiry interval is applied to the payload key as milliseconds (PX), so "
           "messages vanish long before they expire",
           "expiry.dropped_early", False, "lua/save.lua"),
    Defect("ignore_message_expiry",
           "the MQTT 5 message expiry interval is ignored: the default TTL is used and expired messages "
           "are still delivered",
           "expiry.delivered_expired", False, "reference_broker/session.py"),
    Defect("remaining_expiry_not_reduced",
           "messages are forwarded with the original expiry interval instead of the time remaining",
           "expiry.remaining_not_reduced", False, "reference_broker/session.py"),
    Defect("no_dup_on_resend",
           "messages resent after a reconnect carry DUP = 0",
           "order.dup_flag", False, "reference_broker/session.py"),
    Defect("dup_on_first_delivery",
           "every delivery carries DUP = 1, also the first",
           "order.dup_flag", False, "reference_broker/session.py"),
    Defect("puback_not_removing",
           "a subscriber PUBACK does not remove the message from Redis, so it is redelivered after a "
           "reconnect although it was acknowledged",
           "duplicates.redelivered_after_ack", False, "reference_broker/session.py"),
    Defect("session_present_always_zero",
           "CONNACK says session present = 0 although the persistent session (and its backlog) resumed",
           "durability.session_lost", False, "reference_broker/server.py"),
    Defect("live_before_backlog",
           "on reconnect live messages are sent as soon as they arrive, before the stored backlog, so new "
           "messages overtake old ones",
           "order.out_of_order", False, "reference_broker/session.py"),
    Defect("stale_subscription_cache",
           "the fan-out refreshes its subscription cache only every few seconds, so messages published "
           "right after a SUBACK miss the new subscriber",
           "durability.lost", False, "reference_broker/fanout.py"),
    Defect("commit_before_save",
           "the persisted-topic consumer commits its offsets before the Redis save, so a node killed in "
           "between loses the batch",
           "durability.lost", True, "reference_broker/fanout.py"),
)

CATALOG: dict[str, Defect] = {d.name: d for d in _DEFECTS}
