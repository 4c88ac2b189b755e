"""The defect catalog: realistic bugs of this architecture, each off by default.

A scenario switches one on with ``defects = ["name"]`` in its ``[broker]`` table; the suite proves its
worth by catching each one with the invariant named here (the ids of Ordeal's contracts/invariants.py;
the broker only names them, it imports nothing of Ordeal).
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
    where: str         # the part of the broker that carries it (a file that exists; tested)
    shows: str = ""    # how it shows (docs/defects.md "How each shows")
    shows_with: tuple[str, ...] = ()  # other defects that share this "how it shows" text (written once)


_DEFECTS = (
    Defect("score_reset_at_wrap",
           "save script restarts the ZSET score at the packet id when the id wraps 65535 -> 1, so "
           "messages after the wrap sort before older ones",
           "order.out_of_order", False, "lua/save.lua",
           shows=(
           "preset `{client}_last_packet_id` near 65535, store a backlog across the wrap: the messages after the"
           " wrap are delivered first.")),
    Defect("packet_id_wraps_to_zero",
           "save script wraps the packet id 65535 -> 0 instead of 1 (0 is not a valid packet id)",
           "order.packet_id_invalid", False, "lua/save.lua",
           shows=(
           "the same, a delivery with packet id 0 (paho and the checkers see it).")),
    Defect("last_packet_id_from_zset",
           "save script takes the last packet id from the ZSET only, so an empty queue restarts ids at 1 "
           "and {client}_last_packet_id falls behind the ids already handed out",
           "whitebox.last_packet_id_behind", False, "lua/save.lua",
           shows=(
           "acknowledge everything, publish again: ids restart at 1 while `{client}_last_packet_id` still says "
           "the old value.")),
    Defect("trim_newest",
           "trimming over the limit deletes the newest messages instead of the oldest",
           "limits.trim_not_oldest", False, "lua/save.lua",
           shows=(
           "more than the limit while offline; the backlog is the oldest `limit`, or `limit + 1` messages. "
           "What the suite can see of `trim_off_by_one`: the focused test and the white-"
           "box `limits.over_limit` (a `session_snapshot` with `zset_size` > limit) show it every time. The "
           "black-box rule counts only messages acknowledged more than `checks.pipeline_slack_ms` (S) before the"
           " reconnect; of the `limit + 1` newest saved messages, about `limit + 1 - R x (S - lag)` are that old"
           " when publishers run at R msg/s, so with publishing going on up to the reconnect it fires only if `R"
           " x (S - lag) < 1` (never at selftest-trim's rates). So the harness also takes a queue-size probe"
           " (white box) just before every persistent subscriber comes back (docs/history.md): the ZSET then "
           "holds limit + 1, and `limits.over_limit` catches the defect on selftest-trim seed 1 while "
           "the correct broker's probes show exactly the limit. docs/reference-broker.md \"Trimming\"."),
           shows_with=('trim_off_by_one',)),
    Defect("trim_off_by_one",
           "trimming compares with the limit off by one and keeps limit + 1 messages",
           "limits.over_limit", False, "lua/save.lua"),
    Defect("expiry_as_milliseconds",
           "the MQTT 5 message expiry interval is applied to the payload key as milliseconds (PX), so "
           "messages vanish long before they expire",
           "expiry.dropped_early", False, "lua/save.lua",
           shows=(
           "an MQTT 5 message with expiry 30 s is gone after 30 ms.")),
    Defect("ignore_message_expiry",
           "the MQTT 5 message expiry interval is ignored: the default TTL is used and expired messages "
           "are still delivered",
           "expiry.delivered_expired", False, "reference_broker/connection.py",
           shows=(
           "offline backlog with a short / long expiry, reconnect after a wait."),
           shows_with=('remaining_expiry_not_reduced',)),
    Defect("remaining_expiry_not_reduced",
           "messages are forwarded with the original expiry interval instead of the time remaining",
           "expiry.remaining_not_reduced", False, "reference_broker/connection.py"),
    Defect("no_dup_on_resend",
           "messages resent after a reconnect carry DUP = 0",
           "order.dup_flag", False, "reference_broker/connection.py",
           shows=(
           "reconnect with unacknowledged messages; compare DUP on first and second delivery."),
           shows_with=('dup_on_first_delivery',)),
    Defect("dup_on_first_delivery",
           "every delivery carries DUP = 1, also the first",
           "order.dup_flag", False, "reference_broker/connection.py"),
    Defect("puback_not_removing",
           "a subscriber PUBACK does not remove the message from Redis, so it is redelivered after a "
           "reconnect although it was acknowledged",
           "duplicates.redelivered_after_ack", False, "reference_broker/connection.py",
           shows=(
           "acknowledged messages come back after a reconnect.")),
    Defect("session_present_always_zero",
           "CONNACK says session present = 0 although the persistent session (and its backlog) resumed",
           "durability.session_lost", False, "reference_broker/connection.py",
           shows=(
           "CONNACK session present 0, and yet the old backlog arrives.")),
    Defect("live_before_backlog",
           "on reconnect live messages are sent as soon as they arrive, before the stored backlog, so new "
           "messages overtake old ones",
           "order.out_of_order", False, "reference_broker/connection.py",
           shows=(
           "reconnect with a backlog while new messages are published: the new ones arrive first.")),
    Defect("stale_subscription_cache",
           "the fan-out refreshes its subscription cache only every few seconds, so messages published "
           "right after a SUBACK miss the new subscriber",
           "durability.lost", False, "reference_broker/kafka_path.py",
           shows=(
           "publish right after SUBACK: never delivered to the new subscriber.")),
    Defect("commit_before_save",
           "the persisted-topic consumer commits its offsets before the Redis save, so a node killed in "
           "between loses the batch",
           "durability.lost", True, "reference_broker/kafka_path.py",
           shows=(
           "saves failing (or slow) when the node is SIGKILLed: the next node starts after the committed offset "
           "and the batch is gone.")),

    # --- the bug classes a broker of this design (TBMQ's) really has
    Defect("score_from_last_packet_id",
           "every save call seeds the ZSET score from {client}_last_packet_id instead of the queue's newest "
           "score, so after a wrap a batch sorts before the messages still queued from before the wrap",
           "order.out_of_order", False, "lua/save.lua",
           shows=(
           "a backlog that crosses the wrap in more than one save call (p2p-wraparound: sessions preset near "
           "65535, subscribers offline): the messages saved after the wrap are delivered before the older ones.")),
    Defect("packet_id_skips_65535",
           "the save script's wrap test is off by one: packet ids go 65534 -> 1 and 65535 is never handed out",
           "whitebox.packet_id_sequence", False, "lua/save.lua",
           shows=(
           "every delivery is valid and in order, so only the white-box sequence rule sees it: the first "
           "deliveries of a session go ..., 65533, 65534, 1, 2 (p2p-wraparound).")),
    Defect("discarded_queue_kept",
           "a new session (clean start, or the old one expired) replaces the session record but keeps the "
           "old session's queue, so the discarded backlog reaches the new session before any SUBSCRIBE",
           "durability.discarded_session_delivery", False, "reference_broker/server.py",
           shows=(
           "persistent -> clean start (or expired) -> persistent for one client id with a backlog left "
           "behind: the new session gets the old messages right after CONNACK [MQTT-3.1.2-4]. A client that "
           "subscribes at once (every harness client) has its SUBACK a millisecond later, inside the clock "
           "tolerance of `durability.unsubscribed_delivery`; what gives it away is that the messages were "
           "acknowledged seconds before the connect that began the receiving session (session-mix). The correct "
           "broker's own variant of this class (messages of a discarded session "
           "still in the pipeline saved into the next session's queue) is fixed (docs/reference-broker.md).")),
    Defect("backlog_sent_twice",
           "on a resumed session two backlog fetches race (the CONNACK's and the first hint's) and both read "
           "the same entries before either marks them sent: the backlog goes out twice on one connection",
           "duplicates.backlog_twice_in_connection", False, "reference_broker/connection.py",
           shows=(
           "subscribers come back to a backlog (p2p-offline-backlog): each backlog message arrives twice in "
           "the same connection, both times with DUP = 0 and the same packet id, before any reconnect.")),
    Defect("resend_within_connection",
           "a stored message unacknowledged for a second is resent (DUP = 1) on the same connection, an MQTT "
           "3.1.1 habit MQTT 5 forbids (resends only on a reconnect, [MQTT-4.4.0-1])",
           "order.resend_within_connection", False, "reference_broker/connection.py",
           shows=(
           "any PUBACK that takes longer than a second (a slow or partitioned subscriber, withheld acks): the "
           "MQTT 5 subscriber sees the same packet id again, DUP = 1, without having reconnected.")),
    Defect("retry_gives_up",
           "with persisted_failure_strategy = \"retry_forever\" the persisted-topic consumer still gives up after "
           "persisted_failure_retries attempts and commits what it failed to save (TBMQ's retry-then-commit)",
           "durability.lost", True, "reference_broker/kafka_path.py",
           shows=(
           "a Redis outage or write stall longer than retries x backoff (3 x 1 s) while saves are due: the "
           "broker logs \"giving up ... committing anyway\" and the batch is never delivered; a short fault "
           "(2-4 s) or one that also fails the lease check before the commit does not reach it. TBMQ's device "
           "RETRY_ALL strategy (DeviceMsgAcknowledgeStrategyFactory, bca8e9a) does this by design: after `retries` "
           "(only 0 means forever) it commits, logged at DEBUG.")),
    Defect("ack_before_durable",
           "the session store turns Redis' AOF fsync off for throughput (CONFIG SET appendfsync no on every node, "
           "again after a node restarts) while the topology declares appendfsync always: a save is acknowledged, "
           "and its Kafka offset committed, before it is on disk",
           "durability.lost", True, "reference_broker/store.py",
           shows=(
           "only a power loss of every Redis node (power-loss-always: power_loss of redis-all, subscribers offline "
           "with a backlog) shows it: the nodes come back from their last fsync, without every message saved since "
           "the first save, and the offline subscribers' backlogs are gone. A SIGKILL of the same nodes loses "
           "nothing (the page cache keeps what Redis wrote), and a single master's power loss is covered by its "
           "replica (WAIT).")),
    Defect("zero_expiry_breaks_save",
           "a message expiry interval of 0 passes the save script's guard: SET ... EX 0 fails the script "
           "half-way, the poll is retried and skipped, and the messages saved before it are overwritten",
           "durability.lost", False, "lua/save.lua",
           shows=(
           "MQTT 5 publishers send some messages with expiry 0 (or one that runs out in the pipeline): the "
           "save fails with \"invalid expire time\", the broker logs the script error and \"committing anyway\", "
           "and that subscriber's other messages of the batch are lost. TBMQ's save script (DeviceMsgServiceImpl "
           "ADD_MESSAGES_SCRIPT, thingsboard/tbmq bca8e9a) has the same shape: `SET msgKey msgJson EX "
           "(msg.msgExpiryInterval or defaultTtl)` with no guard for 0, and the last packet id written only at the "
           "end.")),

    # --- MQTT 5 delivery rules (docs/reference-broker.md "MQTT coverage")
    Defect("qos_upgrade",
           "the fan-out delivers at the subscription's granted QoS instead of the minimum of it and the published "
           "QoS, so a QoS 1 message goes out at QoS 2 to a QoS 2 subscription",
           "qos.upgraded", False, "reference_broker/kafka_path.py",
           shows=(
           "QoS 1 publishes to QoS 2 subscriptions (mqtt5-delivery): every one of them is delivered with QoS 2, "
           "through its QoS 2 flow (PUBREC / PUBREL / PUBCOMP) [MQTT-3.8.4-8].")),
    Defect("expiry_property_dropped",
           "the PUBLISH to a subscriber leaves out the Message Expiry Interval (the message still expires in the "
           "broker)",
           "expiry.property_missing", False, "reference_broker/connection.py",
           shows=(
           "MQTT 5 publishes with an expiry interval (mqtt5-delivery, p2p-expiry): their deliveries to MQTT 5 "
           "subscribers carry no Message Expiry Interval [MQTT-3.3.2-6].")),
    Defect("user_properties_dropped",
           "the user properties of an MQTT 5 PUBLISH are not kept with the message, so subscribers receive it "
           "without them",
           "props.forwarded_changed", False, "reference_broker/connection.py",
           shows=(
           "[workload] mqtt5_properties (mqtt5-delivery): every delivery's props lacks the two user properties its "
           "publish_invoke row has [MQTT-3.3.2-17].")),
    Defect("receive_maximum_ignored",
           "the client's Receive Maximum is not read: the broker keeps up to its own in-flight window (max_inflight) "
           "of QoS 1 and 2 PUBLISHes unacknowledged on a connection",
           "flow.receive_maximum", False, "reference_broker/connection.py",
           shows=(
           "a subscriber with Receive Maximum 2 that withholds its PUBACKs before it drops (mqtt5-receive-maximum): "
           "every message published meanwhile reaches it, many more than 2 unacknowledged [MQTT-3.3.4-9].")),
    Defect("pubrel_not_resent",
           "the QoS 2 flows a connection had PUBREC for and awaited PUBCOMP on are dropped when it ends, so the "
           "resumed session never resends their PUBREL",
           "qos2.pubrel_not_resent", False, "reference_broker/connection.py",
           shows=(
           "QoS 2 subscribers that stop reading after a PUBREC, drop abruptly and resume (qos2-resume): the "
           "message each answered with PUBREC is never released on the resumed session [MQTT-4.4.0-1] -- and "
           "never delivered (durability.lost too).")),

    # --- the APPLICATION path (docs/reference-broker.md "APPLICATION clients"; the classes of TBMQ #320)
    Defect("app_resend_without_dup",
           "a resumed APPLICATION session does not read the `sent` mark of its `{client}_app` hash, so the "
           "messages it resends from the committed offset go out with DUP = 0",
           "order.dup_flag", False, "reference_broker/application.py",
           shows=(
           "APPLICATION subscribers that withhold their PUBACKs before an abrupt drop (app-offline-backlog): the "
           "resumed session resends the unacknowledged messages with their old packet ids and DUP = 0 "
           "[MQTT-3.3.1-1] (TBMQ #320).")),
    Defect("app_backlog_from_end",
           "a resumed APPLICATION session's consumer seeks to the end of the client's topic, as for a new session, "
           "instead of to the committed offset, so the offline backlog is skipped",
           "durability.lost", False, "reference_broker/application.py",
           shows=(
           "APPLICATION subscribers offline for seconds under fan-in (app-offline-backlog): session present 1 on "
           "the reconnect and no message of the offline window ever arrives; only what is published after the "
           "reconnect does (TBMQ #320: a fresh consumer starting at the end).")),
    Defect("shared_drop_on_leave",
           "a shared-group member that goes away with messages in flight has them counted as delivered instead of "
           "handed to another member, so the group's committed offset passes over them",
           "shared.lost", False, "reference_broker/shared_delivery.py",
           shows=(
           "shared-group members that withhold their PUBACKs before an abrupt drop (shared-groups): what each held "
           "unacknowledged reaches no member of its group (MQTT 5 §4.8.2: it goes to another member when the "
           "first one's session ends).")),

    # --- Will and retained messages (docs/reference-broker.md "Will Messages", "Retained messages")
    Defect("will_after_normal_disconnect",
           "a normal DISCONNECT (reason 0x00) does not clear the Will, so it is published when the connection "
           "closes",
           "will.after_normal_disconnect", False, "reference_broker/connection.py",
           shows=(
           "subscribers with a Will that end some connections with a normal DISCONNECT (will-retained): the "
           "watcher receives the Will of those connections as they close (one with a Will Delay: once the delay "
           "runs out, unless the session resumed first) [MQTT-3.1.2-10].")),
    Defect("will_delay_ignored",
           "the Will Delay Interval is ignored: the Will is published at once when the connection ends, and a "
           "resume within the delay does not cancel it",
           "will.early", False, "reference_broker/connection.py",
           shows=(
           "MQTT 5 subscribers with a Will Delay of 3 s dropped abruptly (will-retained): the watcher receives "
           "their Will right after the drop, seconds before it is due, also when the session resumes within the "
           "delay [MQTT-3.1.3-9]. A Will Delay of 1 s does not show it: the Will reaches the watcher about 0.7 s "
           "after the drop, within the clock tolerance of its due time.")),
    Defect("retained_in_node_memory",
           "retained messages are kept in the node's memory instead of Redis, so a broker node kill loses them "
           "and another node does not know them",
           "retained.not_last", False, "reference_broker/store.py",
           shows=(
           "late subscribers to the retained topics (will-retained): one connected to a node other than the one "
           "its topic's newest retained message was published through, or to a node restarted since, receives "
           "an older retained message or none [MQTT-3.3.1-5], [MQTT-3.3.1-6].")),
)

CATALOG: dict[str, Defect] = {d.name: d for d in _DEFECTS}


class UnknownDefectError(ValueError):
    """A defect name that is not in the catalog (a misspelt switch would silently never turn on)."""


def require_known(names: tuple[str, ...] | list[str], where: str) -> None:
    """Raise UnknownDefectError naming ``where``, the unknown names and every valid one."""
    unknown = [name for name in names if name not in CATALOG]
    if unknown:
        raise UnknownDefectError(f"{where}: unknown defect(s) {', '.join(map(repr, unknown))}; "
                                 f"known defects: {', '.join(sorted(CATALOG))}")
