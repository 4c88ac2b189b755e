"""The invariant vocabulary (docs/architecture.md) with what each id means, and the defaults every check
is judged with: one table, one place.

The ids are the contract between scenarios' ``checks.allowed``, the defect catalog, the checkers and the
reports; this module is the only place that spells them (contracts/scenario.py validates ``allowed``
against it, spark_checkers decides each one).  Each default below exists only here.
"""

from __future__ import annotations

from dataclasses import dataclass

# -- The defaults the checks are judged with (scenario [checks]; docs/scenarios.md, docs/invariants.md) -----
# How far apart two clocks of this machine may be read for the same event (a publisher's send stamp vs the
# subscriber's receive stamp; an expiry deadline vs a delivery).  500 ms: the value every scenario has
# carried into scenario.json (contracts/scenario.py CheckSpec), so every stored run was judged with it; the
# checker's own fallback of 200 ms only ever applied to hand-written scenario.json files without the key
# (synthetic histories, benchmarks), a drift, not a second policy.
DEFAULT_CLOCK_TOLERANCE_MS = 500
# How long an acknowledged message may still be in the broker's pipeline (Kafka -> Redis) when a subscriber
# reconnects; the black-box limit rules count only the backlog acknowledged before that.
DEFAULT_PIPELINE_SLACK_MS = 2000
# The reference broker's limit and TTL when a scenario.json carries no [broker] values (hand-written or
# synthetic histories): TBMQ's defaults.  The reference broker's own come from its config
# (reference_broker/config.py) through scenario.json.  They never apply to an external target: it is judged
# only against what its [target] declares (no limit and no TTL when it declares none).
UNDECLARED_QUEUE_LIMIT = 10000
UNDECLARED_TTL_S = 604800
# How long a node that stopped answering under a planned fault may take to answer again once the fault's cover
# ended (health.unresponsive): its recovery, not a new failure.  60 s: RabbitMQ 3.10 under pause_minority
# restarts its applications when the partition ends, 10-11 s in rabbitmq-cluster-partition (docs/findings.md);
# a node that has not answered within it, or never again, fails.  A node that stops answering with no fault
# covering it gets only the probe's grace.
RECOVERY_AFTER_FAULT_S = 60
# How long after it is due a Will may still reach its subscriber (will.missing), beyond the pipeline slack: a
# broker node killed under the connection publishes it only once another node took over its sessions (the
# reference broker: up to 3 partition leases, docs/reference-broker.md "Will Messages").
WILL_SLACK_S = 20
MAX_QUEUE_LIMIT = 65535  # a larger limit would let packet ids (1..65535) collide with stored messages


@dataclass(frozen=True)
class Invariant:
    id: str
    title: str
    reported_only: bool = False  # liveness: counted and plotted, never failing the run
    white_box: bool = False  # needs the reference broker's session snapshots
    needs_complete_history: bool = False  # decided from an absence: an incomplete history cannot pass it
    # Counted, but what it counts the target never promised to prevent (its declaration): verdict "allowed".
    declared_allowance: bool = False
    queue_policies: tuple[str, ...] = ()  # a limits rule: applicable only under these declared queue policies
    # The normative statement it checks, in words, with its id in the MQTT specifications ("[MQTT-3.8.4-8] The
    # QoS of ... MUST be the minimum of ..."); or the broker behaviour it comes from.  Shown beside a failing
    # verdict in every report; docs/invariants.md lists the same statements.
    statement: str = ""
    # Needs a history of schema version 2 (contracts/history_schema.py V2_COLUMNS / kinds): unknown on an older one.
    needs_v2: bool = False
    # Judged only over MQTT 5 connections (an MQTT 3.1.1 history cannot show it: not applicable).
    mqtt5_only: bool = False


# The normative statements several rules check, worded once.
_QOS_MINIMUM = ("[MQTT-3.8.4-8] The QoS of Application Messages sent in response to a Subscription MUST be the minimum "
                "of the QoS of the originally published message and the Maximum QoS granted by the Server")
_EXPIRY_REDUCED = ("[MQTT-3.3.2-6] The PUBLISH packet sent to a Client by the Server MUST contain a Message Expiry "
                   "Interval set to the received value minus the time that the Application Message has been waiting "
                   "in the Server.")


INVARIANTS: tuple[Invariant, ...] = (
    Invariant("durability.lost", "Owed message never delivered after the drain", needs_complete_history=True,
              statement=("[MQTT-4.5.0-1] When a Server takes ownership of an incoming Application Message it MUST add it to "
                         "the Session State for those Clients that have matching Subscriptions; [MQTT-3.1.2-23] the Client and "
                         "Server MUST store the Session State after the Network Connection is closed if the Session Expiry "
                         "Interval is greater than 0; [MQTT-4.4.0-1] unacknowledged PUBLISH packets are resent on the "
                         "reconnect (MQTT 3.1.1 [MQTT-3.1.2-4], [MQTT-3.1.2-5]: after the disconnection of a CleanSession = 0 "
                         "Session the Server MUST store further QoS 1 and QoS 2 messages that match its subscriptions). QoS 1 "
                         "and 2 arrive at least once (§4.3.2, §4.3.3).")),
    Invariant("durability.lost_allowed", "Owed message lost to a fault the target never promised to survive "
              "(its declared persistence)", needs_complete_history=True, declared_allowance=True,
              statement=("The target's declaration: a message lost to a fault its declared persistence does not cover "
                         "([target] promises.persistence) is allowed; the statement it would otherwise break is [MQTT-4.5.0-1] "
                         "(durability.lost).")),
    Invariant("durability.session_lost", "Persistent session not present on reconnect",
              statement=("[MQTT-3.2.2-3] If the Server accepts a connection with Clean Start set to 0 and the Server has "
                         "Session State for the ClientID, it MUST set Session Present to 1; [MQTT-3.1.2-5] it MUST resume "
                         "communications with the Client based on state from the existing Session; [MQTT-3.1.2-23] that state "
                         "is kept while the Session Expiry Interval runs (MQTT 3.1.1 [MQTT-3.2.2-2], [MQTT-3.1.2-4]).")),
    Invariant("durability.session_returned", "A session the broker reported lost (session present 0) presented again "
              "on a later reconnect",
              statement=("[MQTT-3.1.2-6] With Clean Start 0 and no Session the Server MUST create a new Session, and answers "
                         "Session Present 0 [MQTT-3.2.2-3]; the state it so reported gone cannot be present again (MQTT 3.1.1 "
                         "[MQTT-3.1.2-6]: state data associated with a discarded Session MUST NOT be reused in any subsequent "
                         "Session).")),
    Invariant("durability.clean_start_session_present", "Session present 1 on a connection accepted with clean "
              "start 1 (CleanSession = 1)",
              statement="[MQTT-3.2.2-2] If the Server accepts a connection with Clean Start set to 1, the Server MUST "
                        "set Session Present to 0 in the CONNACK packet in addition to setting a 0x00 (Success) Reason "
                        "Code in the CONNACK packet (MQTT 3.1.1 [MQTT-3.2.2-1], CleanSession = 1)."),
    Invariant("durability.expired_session_present", "Session present 1 on a reconnect after the session's expiry "
              "interval had elapsed", mqtt5_only=True,
              statement=("[MQTT-4.1.0-2] The Server MUST discard the Session State when the Network Connection is closed and "
                         "the Session Expiry Interval has passed; [MQTT-3.2.2-3] it sets Session Present to 1 only when it has "
                         "Session State for the ClientID.")),
    Invariant("durability.session_lost_allowed", "Persistent session lost to a fault the target never promised to "
              "survive (its declared persistence)", declared_allowance=True,
              statement=("The target's declaration: a session lost to a fault its declared persistence does not cover is "
                         "allowed; the statement it would otherwise break is [MQTT-3.2.2-3] (durability.session_lost).")),
    Invariant("durability.phantom", "Delivered but never published, or body differs from what was published",
              statement=("No single id: a PUBLISH a Server sends is the forwarding of a published Application Message "
                         "([MQTT-4.5.0-1]; its Payload is the Application Message as published, §3.3.3), so one never "
                         "published, or with another body, is none. Identity from the payload (docs/architecture.md).")),
    Invariant("durability.unsubscribed_delivery", "Delivered to a client with no matching subscription",
              statement=("[MQTT-3.3.2-3] The Topic Name in a PUBLISH packet sent by a Server to a subscribing Client MUST "
                         "match the Subscription's Topic Filter; [MQTT-4.5.0-1] a message is added to the Session State of the "
                         "Clients with matching Subscriptions (MQTT 3.1.1 [MQTT-3.3.2-3]).")),
    Invariant("durability.discarded_session_delivery", "A discarded session's message delivered to a later session of "
              "its client id: acknowledged more than the pipeline slack before the connect that began the receiving "
              "session ([MQTT-3.1.2-4])",
              statement=("[MQTT-3.1.2-4] If a CONNECT packet is received with Clean Start set to 1, the Client and Server MUST "
                         "discard any existing Session and start a new Session; [MQTT-4.1.0-2] an expired Session's state is "
                         "discarded (MQTT 3.1.1 [MQTT-3.1.2-6]: state data associated with this Session MUST NOT be reused in "
                         "any subsequent Session).")),
    Invariant("durability.delivered_after_failed_publish", "Delivered although its publish definitely failed",
              statement=("A PUBACK or PUBREC with a Reason Code of 0x80 or greater says the receiver did not accept the "
                         "message (§4.13.2; it takes ownership only with its success answer, [MQTT-4.3.2-4], [MQTT-4.3.3-8]); "
                         "a message the Server never took ownership of is added to no Session [MQTT-4.5.0-1].")),
    Invariant("order.out_of_order", "First deliveries of a publisher's stream to a subscriber out of sequence",
              statement=("[MQTT-4.6.0-5] When a Server processes a message that has been published to an Ordered Topic, it "
                         "MUST send PUBLISH packets to consumers (for the same Topic and QoS) in the order that they were "
                         "received from any given Client; [MQTT-4.6.0-6] by default every Topic of a Non-shared Subscription "
                         "is an Ordered Topic (MQTT 3.1.1: the same two, numbered [MQTT-4.6.0-6] and [MQTT-4.6.0-5]).")),
    Invariant("order.packet_id_invalid", "Packet id 0, missing or above 65535 on a QoS > 0 delivery",
              statement=("[MQTT-2.2.1-4] Each time a Server sends a new PUBLISH (with QoS > 0) MQTT Control Packet it MUST "
                         "assign it a non zero Packet Identifier that is currently unused (a Two Byte Integer: 1..65535; MQTT "
                         "3.1.1 [MQTT-2.3.1-1], [MQTT-2.3.1-4]).")),
    Invariant("order.packet_id_reused", "Packet id reused for another message while still unacknowledged",
              statement=("[MQTT-2.2.1-4] Each time a Server sends a new PUBLISH (with QoS > 0) it MUST assign it a non zero "
                         "Packet Identifier that is currently unused; [MQTT-4.3.2-1], [MQTT-4.3.3-1] an unused one for each "
                         "new Application Message; an id is in use until its PUBACK or PUBCOMP (MQTT 3.1.1 [MQTT-2.3.1-2], "
                         "[MQTT-2.3.1-4]).")),
    Invariant("order.dup_flag", "DUP set on a first delivery, or missing on a resend",
              statement=("[MQTT-3.3.1-1] The DUP flag MUST be set to 1 by the Client or Server when it attempts to re-deliver "
                         "a PUBLISH packet; [MQTT-3.3.1-3] its value MUST be determined solely by whether the outgoing PUBLISH "
                         "packet is a retransmission; [MQTT-4.3.2-2], [MQTT-4.3.3-2] a new message goes with DUP 0 (MQTT 3.1.1 "
                         "[MQTT-3.3.1-1], [MQTT-3.3.1-3]).")),
    Invariant("order.resend_within_connection", "MQTT 5 PUBLISH resent within the connection it was sent on "
              "(resends only on a reconnect, [MQTT-4.4.0-1])",
              statement=("[MQTT-4.4.0-1] When a Client reconnects with Clean Start set to 0 and a session is present, both the "
                         "Client and Server MUST resend any unacknowledged PUBLISH packets (where QoS > 0) and PUBREL packets "
                         "using their original Packet Identifiers. This is the only circumstance where a Client or Server is "
                         "REQUIRED to resend messages. Clients and Servers MUST NOT resend messages at any other time.")),
    Invariant("qos.upgraded", "Delivered at a higher QoS than it was published with",
              statement=_QOS_MINIMUM + " (MQTT 3.1.1 [MQTT-3.8.4-6]): never above the published QoS."),
    Invariant("qos.above_grant", "Delivered at a higher QoS than every matching subscription was granted",
              statement=_QOS_MINIMUM + " (MQTT 3.1.1 [MQTT-3.8.4-6]): never above the grant."),
    Invariant("qos.downgraded", "Delivered at a lower QoS than the minimum of its published QoS and the granted QoS",
              statement=(_QOS_MINIMUM + "; [MQTT-3.3.4-2] with overlapping subscriptions the Server MUST deliver the "
                         "message to the Client respecting the maximum QoS of all the matching subscriptions (MQTT 3.1.1 [MQTT-3.8.4-6], "
                         "[MQTT-3.3.5-1]).")),
    Invariant("qos2.pubrel_not_resent", "A QoS 2 message the subscriber answered with PUBREC never released "
              "(PUBREL) after its session resumed", needs_complete_history=True, needs_v2=True,
              statement=("[MQTT-4.4.0-1] When a Client reconnects with Clean Start set to 0 and a session is present, both the "
                         "Client and Server MUST resend any unacknowledged PUBLISH packets (where QoS > 0) and PUBREL packets "
                         "using their original Packet Identifiers; [MQTT-4.3.3-5] the sender MUST treat the PUBREL packet as "
                         "unacknowledged until it has received the corresponding PUBCOMP (MQTT 3.1.1 [MQTT-4.4.0-1]).")),
    Invariant("expiry.property_missing", "MQTT 5 message published with a Message Expiry Interval forwarded without "
              "it", needs_v2=False, mqtt5_only=True,
              statement=_EXPIRY_REDUCED),
    Invariant("props.forwarded_changed", "Payload format, content type, correlation data, response topic or user "
              "properties not forwarded unchanged", needs_v2=True, mqtt5_only=True,
              statement=("[MQTT-3.3.2-4] A Server MUST send the Payload Format Indicator unaltered to all subscribers "
                         "receiving the Application Message; likewise the Response Topic [MQTT-3.3.2-15], the Correlation Data "
                         "[MQTT-3.3.2-16] and the Content Type [MQTT-3.3.2-20]; [MQTT-3.3.2-17] the Server MUST send all User "
                         "Properties unaltered in a PUBLISH packet when forwarding the Application Message to a Client, "
                         "[MQTT-3.3.2-18] maintaining their order.")),
    Invariant("props.subscription_ids", "Subscription identifiers of a delivery not those of the matching "
              "subscriptions", needs_v2=True, mqtt5_only=True,
              statement=("[MQTT-3.3.4-3] If the Client specified a Subscription Identifier for any of the overlapping "
                         "subscriptions the Server MUST send those Subscription Identifiers in the message which is published "
                         "as the result of the subscriptions; [MQTT-3.3.4-4] a single copy carries those of all matching "
                         "subscriptions that have one, in any order; [MQTT-3.3.4-5] each of several copies the one of its "
                         "matching subscription.")),
    Invariant("props.retain_as_published", "RETAIN flag of a forwarded message not as the subscription's Retain As "
              "Published option requires",
              statement=("[MQTT-3.3.1-12] If the value of Retain As Published subscription option is set to 0, the Server MUST "
                         "set the RETAIN flag to 0 when forwarding an Application Message regardless of how the RETAIN flag "
                         "was set in the received PUBLISH packet; [MQTT-3.3.1-13] if it is set to 1, the Server MUST set the "
                         "RETAIN flag equal to the RETAIN flag in the received PUBLISH packet (MQTT 3.1.1 [MQTT-3.3.1-9]: "
                         "RETAIN 0 when sent because it matches an established subscription).")),
    Invariant("flow.receive_maximum", "More unacknowledged QoS > 0 PUBLISH packets sent to a client than its Receive "
              "Maximum", needs_v2=True, mqtt5_only=True,
              statement=("[MQTT-3.3.4-9] The Server MUST NOT send more than Receive Maximum QoS 1 and QoS 2 PUBLISH packets "
                         "for which it has not received PUBACK, PUBCOMP, or PUBREC with a Reason Code of 128 or greater from "
                         "the Client; [MQTT-4.9.0-2] with its send quota at zero it MUST NOT send any more PUBLISH packets "
                         "with QoS > 0.")),
    Invariant("flow.packet_too_large", "PUBLISH sent to a client larger than its Maximum Packet Size", needs_v2=True,
              mqtt5_only=True,
              statement=("[MQTT-3.1.2-24] The Server MUST NOT send packets exceeding Maximum Packet Size to the Client; "
                         "[MQTT-3.1.2-25] where a Packet is too large to send, the Server MUST discard it without sending it "
                         "and then behave as if it had completed sending that Application Message.")),
    Invariant("expiry.delivered_expired", "Delivered after its expiry (beyond the clock tolerance)",
              statement=("[MQTT-3.3.2-5] If the Message Expiry Interval has passed and the Server has not managed to start "
                         "onward delivery to a matching subscriber, then it MUST delete the copy of the message for that "
                         "subscriber (without an interval: the broker's declared message TTL).")),
    Invariant("expiry.remaining_not_reduced", "MQTT 5 remaining expiry not reduced by the time it waited",
              statement=_EXPIRY_REDUCED),
    Invariant("expiry.dropped_early", "Message with an expiry interval dropped before it expired",
              needs_complete_history=True,
              statement=("[MQTT-4.5.0-1] A message is added to the Session State of the matching subscribers, and "
                         "[MQTT-3.3.2-5] deleted for one only once its Message Expiry Interval has passed before onward "
                         "delivery began: one dropped before that was lost.")),
    Invariant("limits.over_limit", "More messages kept than the configured limit",
              queue_policies=("drop_oldest", "drop_newest", "reject"),
              statement=("The target's declared queue limit (TBMQ: persisted_messages_limit per offline session; MQTT leaves a "
                         "Server's storage capacity to the implementation, §4.1.1): never more kept than the limit.")),
    Invariant("limits.trimmed_under_limit", "Trimmed more than needed: queue left under the limit",
              needs_complete_history=True, queue_policies=("drop_oldest", "drop_newest"),
              statement=("The target's declared queue limit: a trim makes room only once the queue is over the limit (TBMQ "
                         "trims to the limit after each save); a queue left under it lost messages it could keep "
                         "([MQTT-4.5.0-1]).")),
    Invariant("limits.trim_not_oldest", "Trimmed messages were not the oldest (policy drop_oldest)",
              needs_complete_history=True, queue_policies=("drop_oldest",),
              statement=("The target's declared queue policy drop_oldest (TBMQ: after each save the lowest-scored, oldest, "
                         "entries beyond the limit are deleted): the newest are kept.")),
    Invariant("limits.trim_not_newest", "Dropped messages were not the newest (policy drop_newest)",
              needs_complete_history=True, queue_policies=("drop_newest",),
              statement=("The target's declared queue policy drop_newest (Mosquitto's max_queued_messages): once the queue is "
                         "full, new messages are dropped and the oldest kept.")),
    Invariant("duplicates.redelivered_after_ack", "Redelivered after the subscriber acknowledged it",
              statement=("[MQTT-4.3.2-3] The sender MUST treat the PUBLISH packet as unacknowledged until it has received the "
                         "corresponding PUBACK packet; [MQTT-4.4.0-1] only unacknowledged PUBLISH packets are resent, on a "
                         "reconnect, and at no other time: an acknowledged message is not sent again (MQTT 3.1.1 "
                         "[MQTT-4.3.2-1], [MQTT-4.4.0-1]).")),
    Invariant("duplicates.qos2", "QoS 2 message delivered more than once",
              statement=("QoS 2 is exactly once (§4.3.3): [MQTT-4.3.3-6] the sender MUST NOT re-send the PUBLISH once it has "
                         "sent the corresponding PUBREL; [MQTT-4.4.0-1] only unacknowledged packets are resent (MQTT 3.1.1 "
                         "[MQTT-4.3.3-1], [MQTT-4.4.0-1]).")),
    Invariant("duplicates.backlog_twice_in_connection", "Message delivered twice within one connection, as two "
              "distinct deliveries (not a DUP resend)",
              statement=("[MQTT-4.4.0-1] Clients and Servers MUST NOT resend messages at any other time than a reconnect with "
                         "a session present; a message is added to a Session once [MQTT-4.5.0-1], so a second copy within one "
                         "connection is neither a resend nor owed.")),
    Invariant("whitebox.orphan_payloads", "Payload keys with no reference in the session ZSET", white_box=True,
              statement=("The reference broker's Redis layout (TBMQ, lua/): every {client}_messages_<pid> payload is "
                         "referenced by the session's ZSET; a removal deletes both.")),
    Invariant("whitebox.dangling_refs", "ZSET references whose payload key is gone", white_box=True,
              statement=("The reference broker's Redis layout (TBMQ, lua/): every member of a session's ZSET has its payload "
                         "key until it is removed.")),
    Invariant("whitebox.last_packet_id_behind", "Stored last packet id behind the highest stored id delivered",
              white_box=True,
              statement=("The reference broker's Redis layout (TBMQ, lua/save.lua): {client}_last_packet_id is the last stored "
                         "packet id handed out.")),
    Invariant("whitebox.packet_id_sequence", "First-delivery packet ids of a persistent session skip a value "
              "(the reference broker allocates 1..65535 in order, then 1)", white_box=True,
              statement=("The reference broker's lua/save.lua: a persistent session's stored messages take ids 1..65535 in "
                         "order, then 1 again (MQTT asks only that the id be unused: [MQTT-2.2.1-4]); a skipped id is a stored "
                         "message the session lost.  An APPLICATION client's session (the broker's application_clients) is "
                         "not judged: save.lua does not store it, its ids follow its Kafka topic's offsets, and offsets a "
                         "failed produce took are never delivered.")),
    Invariant("liveness.unseen_over_time", "Owed-but-unseen messages over time", reported_only=True,
              statement=("Reported, no normative statement: the owed messages not yet seen, over time.")),
    Invariant("liveness.stuck_inflight", "Delivered QoS > 0 messages never acknowledged by the subscriber",
              reported_only=True,
              statement=("Reported: QoS > 0 deliveries the subscriber never acknowledged ([MQTT-4.3.2-4], [MQTT-4.3.3-11] bind "
                         "the client; shown as the harness saw them).")),
    Invariant("logs.error_lines", "No node's log shows a line the scenario's declared patterns fail (ERROR lines, "
              "\"committing anyway\", script errors, tracebacks, crashes)",
              statement=("The scenario's declared log patterns ([checks.logs]), no MQTT statement: a line a pattern fails is a "
                         "broken promise of the target.")),
    Invariant("logs.reported_lines", "Log lines the declared patterns report: counted and shown, never failing",
              reported_only=True,
              statement=("The scenario's declared log patterns ([checks.logs]): reported, never failing.")),
    Invariant("will.missing", "A Will owed by a connection that ended without a normal DISCONNECT (and whose session "
              "did not resume within its Will Delay) reached no subscriber of its topic", needs_complete_history=True,
              statement=("[MQTT-3.1.2-8] If the Will Flag is set to 1 the Will Message MUST be published when the Network "
                         "Connection is subsequently closed unless the Will Message has been deleted by the Server on receipt "
                         "of a DISCONNECT packet with Reason Code 0x00 (Normal disconnection); [MQTT-3.1.3-9] the Server "
                         "delays publishing the Will Message until the Will Delay Interval has passed or the Session ends, "
                         "whichever happens first (MQTT 3.1.1 [MQTT-3.1.2-8]: published when the connection closes).")),
    Invariant("will.after_normal_disconnect", "A Will published although its connection ended with a normal DISCONNECT",
              statement=("[MQTT-3.1.2-10] The Will Message MUST be removed from the stored Session State in the Server once "
                         "it has been published or the Server has received a DISCONNECT packet with a Reason Code of 0x00 "
                         "(Normal disconnection) from the Client (MQTT 3.1.1 [MQTT-3.1.2-10]: deleted on receipt of "
                         "DISCONNECT, without being published).")),
    Invariant("will.early", "A Will published before it was due: while its connection was open, before its Will Delay "
              "Interval passed while the session lived, or although the session resumed within the delay",
              statement=("[MQTT-3.1.3-9] If a new Network Connection to this Session is made before the Will Delay Interval "
                         "has passed, the Server MUST NOT send the Will Message; the Server delays publishing the Client's "
                         "Will Message until the Will Delay Interval has passed or the Session ends, whichever happens first "
                         "(judged with the clock tolerance).")),
    Invariant("shared.lost", "A message owed to a shared group ($share/NAME/FILTER) reached none of its members",
              needs_complete_history=True,
              statement=("MQTT 5 §4.8.2: a Shared Subscription's Application Message is sent to one of the Sessions "
                         "attached to it, at the QoS it granted [MQTT-4.8.2-3]; a QoS 1 message whose member's connection "
                         "broke before its PUBACK may wait for that member's reconnect, and if that Session terminates "
                         "first the Server SHOULD send it to another member; a QoS 2 one MUST be completed on the "
                         "member's reconnect [MQTT-4.8.2-4] and, if its Session terminates first, MUST NOT go to another "
                         "[MQTT-4.8.2-5] (so a QoS 2 message is owed only while no member's session ended). TBMQ: the "
                         "group's Kafka consumer group reads on from its committed offset. Owed: acknowledged to its "
                         "publisher while a member held the subscription, and the group held from then to the end.")),
    Invariant("shared.redelivered_after_ack", "A shared group's message sent to a second member after a member "
              "acknowledged it, with no fault of the target between",
              statement=("MQTT 5 §4.8.2: a message goes to another member only if the member it was sent to left it "
                         "unacknowledged; [MQTT-4.3.2-3] a PUBLISH is unacknowledged only until its PUBACK arrives, "
                         "[MQTT-4.4.0-1] only unacknowledged ones are resent, and a QoS 2 message never goes to another "
                         "member [MQTT-4.8.2-5]. A fault or node event between the acknowledgement and the second "
                         "delivery (a killed node's uncommitted acknowledgements are read again), or a connection that "
                         "ended within the clock tolerance of the acknowledgement (the PUBACK may never have left), "
                         "excuses it.")),
    Invariant("shared.duplicates", "Messages of a shared group that reached more than one member: counted, never "
              "failing", reported_only=True,
              statement=("MQTT 5 §4.8.2: a QoS 1 message left unacknowledged by a member whose session ended goes to "
                         "another member (at least once for the group): such duplicates are legal (a QoS 2 one goes to no "
                         "other member, [MQTT-4.8.2-5]); counted so a report shows how many.")),
    Invariant("retained.not_last", "A new subscription to a retained topic got, as its retained copy, a message older "
              "than the newest retained message acknowledged before the subscribe, or none while one was",
              needs_complete_history=True,
              statement=("[MQTT-3.3.1-5] If the RETAIN flag is set to 1 in a PUBLISH packet sent by a Client to a Server, the "
                         "Server MUST replace any existing retained message for this topic and store the Application Message; "
                         "[MQTT-3.3.1-6] if the Session is new or the subscription is new (Retain Handling 0, [MQTT-3.3.1-9]), "
                         "the Server sends the retained messages matching the filter, with the RETAIN flag 1 "
                         "[MQTT-3.3.1-8] (MQTT 3.1.1 [MQTT-3.3.1-5], [MQTT-3.3.1-6]: the last retained message of a topic "
                         "is sent to every new subscription matching it). A zero-byte retained message deletes it "
                         "([MQTT-3.3.1-10]); the workload sends none.")),
    Invariant("health.unplanned_exit", "No node of the target exited outside every planned fault (a crash, an "
              "out-of-memory kill, a kill from outside the run)",
              statement=("No MQTT statement: a broker node that exits outside every planned fault fails its clients; what it "
                         "kept is what its persistence promised.")),
    Invariant("health.unresponsive", "No node of the target stopped answering (its readiness probe failing for "
              "longer than the probe's grace) outside every planned fault",
              statement=("No MQTT statement: a node of the target keeps answering its readiness probe outside every planned "
                         "fault.")),
    Invariant("meta.history_complete", "The history is complete and the drain ended quietly",
              statement=("The suite's own (docs/history.md): what a history does not hold cannot be decided; an incomplete "
                         "history is unknown, never a pass.")),
    Invariant("meta.fault_bit", "Every scheduled fault applied and proved that it bit",
              statement=("The suite's own (docs/faults.md): a fault that did not take effect tested nothing.")),
    Invariant("meta.checker_error", "Every checker ran without error",
              statement=("The suite's own: a checker that failed decided nothing.")),
)

BY_ID: dict[str, Invariant] = {invariant.id: invariant for invariant in INVARIANTS}
IDS: tuple[str, ...] = tuple(BY_ID)


def validate_ids(ids: list[str] | tuple[str, ...], where: str) -> tuple[str, ...]:
    """Reject unknown invariant ids with a message naming the place and the valid choices."""
    unknown = [value for value in ids if value not in BY_ID]
    if unknown:
        raise ValueError(f"{where}: unknown invariant id(s) {unknown}; expected ids from: {', '.join(IDS)}")
    return tuple(ids)


# -- The log oracle (docs/invariants.md "Node logs"): which lines of which node's log a run is judged by ------
# A scenario's [checks.logs] declares them (contracts/scenario.py); these are the defaults per target.
# Verdicts of a pattern: "fail" (logs.error_lines: a violation), "report" (logs.reported_lines: counted and
# shown, never failing), "ignore" (an exception: the line is matched by no later pattern).  The first
# pattern that matches a line decides it, so an exception is declared before the rule it narrows.
LOG_VERDICTS = ("fail", "report", "ignore")
LOG_PRESETS = ("reference", "mosquitto", "rabbitmq", "ejabberd", "none")
# A line the harness itself writes into a node's log (one per start: the argv), never judged.
HARNESS_LOG_MARKER = "=== ordeal: "


@dataclass(frozen=True)
class LogPattern:
    name: str
    regex: str  # Python re syntax, searched (re.search, re.MULTILINE) in each record's text (docs/invariants.md)
    verdict: str = "fail"
    roles: tuple[str, ...] = ()  # node roles it applies to (redis, kafka, storage, broker, mqtt-broker); () = all
    nodes: tuple[str, ...] = ()  # node-name globs (fnmatch: "broker-*"); () = all
    why: str = ""  # shown with every witness: why such a line matters
    source: str = "scenario"  # "scenario" or "default:<preset>"

    def to_dict(self) -> dict:
        return {"name": self.name, "regex": self.regex, "verdict": self.verdict, "roles": list(self.roles),
                "nodes": list(self.nodes), "why": self.why, "source": self.source}


def _reference_log_patterns(broker: dict) -> tuple[LogPattern, ...]:
    """The reference topology's defaults, read from real logs of every shipped fault scenario (p2p-smoke,
    redis-master-kill, broker-node-kill, kafka-broker-kill, partitions: docs/invariants.md).  ``broker``: the
    reference broker's whole configuration (scenario.json "broker"): a stage whose failure strategy is
    ``skip`` (TBMQ's default) gives up on records by design, so its "committing anyway" is reported; under
    ``retry_forever`` (the fault scenarios: nothing may be skipped) the same line is a violation."""
    import re

    src = "default:reference"
    patterns = []
    for stage, default_topic in (("incoming", "tbmq.msg.all"), ("persisted", "tbmq.msg.persisted")):
        strategy = broker.get(f"{stage}_failure_strategy", "skip")
        topic = re.escape(str(broker.get(f"{stage}_topic", default_topic)))
        skip = strategy == "skip"
        patterns.append(LogPattern(
            f"committing_anyway.{stage}", rf" {topic}: giving up\b.*\bcommitting anyway",
            "report" if skip else "fail", ("broker",),
            why=(f"{stage}_failure_strategy = {strategy!r}: "
                 + ("TBMQ's skip strategy gives up on the records and commits their offsets; they are lost on "
                    "purpose (reported)" if skip else
                    "a strategy that must not lose records committed records it failed to save")), source=src))
    patterns += [
        # Redis refuses every write while its AOF cannot be written (MISCONF: a full disk, disk-full-redis): the
        # check is a node-wide state that cannot change while a script runs, so a script meets it at its first
        # write and has written nothing; the broker retries the whole save (docs/findings.md, "Disk full").
        LogPattern("redis_refused_write", r"MISCONF Errors writing to the AOF file", "report", ("broker",),
                   why="Redis refused the broker's writes while its AOF could not be written (the script wrote "
                       "nothing; the broker retries)", source=src),
        LogPattern("lua_script_error", r"user_script:\d+|@user_function|Error (?:running|compiling) script"
                   r"|BUSY Redis is busy running a script", "fail", ("broker",),
                   why="a Redis script of the broker failed (lua/): its writes may be partial", source=src),
        LogPattern("broker_error", r"^\S+ \S+ \S+ (?:ERROR|CRITICAL) reference_broker[.:]", "fail", ("broker",),
                   why="the broker itself logged an error (it gave up on something)", source=src),
        # aiokafka / redis-py log their own connection retries at ERROR while Kafka or Redis is down (seen in
        # every kafka-broker-kill run of the correct broker: "Unable connect to node", "Failed fetch
        # messages"); the broker survives them by design, so they are counted, not failed.
        LogPattern("library_error", r"^\S+ \S+ \S+ (?:ERROR|CRITICAL) ", "report", ("broker",),
                   why="a client library (aiokafka, redis-py) logged an error while retrying", source=src),
        LogPattern("python_traceback", r"^Traceback \(most recent call last\):", "fail", ("broker",),
                   why="an exception no one handled (a traceback not under a library's ERROR line)", source=src),
        LogPattern("redis_crash", r"REDIS BUG REPORT|Guru Meditation|ASSERTION FAILED|Out Of Memory allocating"
                   r"|Fatal error", "fail", ("redis",), why="Redis itself crashed or refused its data", source=src),
        LogPattern("redis_slow_script", r"Slow script detected", "report", ("redis",),
                   why="a script held the Redis node past its busy time", source=src),
        LogPattern("tansu_panic", r"panicked at|^thread '.*' panicked", "fail", ("kafka",),
                   why="Tansu (the Kafka stand-in) panicked", source=src),
        LogPattern("tansu_error", r"\bERROR\b", "report", ("kafka",),
                   why="Tansu logged an error", source=src),
        LogPattern("storage_error", r'^Traceback \(most recent call last\):|" 5\d\d ', "report", ("storage",),
                   why="the S3 stand-in failed a request (Tansu's storage; not the broker under test)", source=src),
    ]
    return tuple(patterns)


def _mosquitto_log_patterns() -> tuple[LogPattern, ...]:
    # Mosquitto 2.0 (log_type error / warning / notice): "<epoch>: Error: ...", "<epoch>: Warning: ...".
    # A client's abrupt close is a notice ("Socket error on client X, disconnecting."), never "Error:".
    src = "default:mosquitto"
    return (LogPattern("mosquitto_error", r"^\d+: Error: ", "fail", why="Mosquitto logged an error", source=src),
            LogPattern("mosquitto_warning", r"^\d+: Warning: ", "report", why="Mosquitto logged a warning",
                       source=src))


def _rabbitmq_log_patterns() -> tuple[LogPattern, ...]:
    # RabbitMQ 3.10 ("<time> [error] <pid> ..."; a multi-line report repeats the prefix on every line).
    src = "default:rabbitmq"
    return (LogPattern("rabbitmq_shutdown_report", r"errorContext: shutdown_error\n.*\breason: (?:shutdown|noproc)$",
                       "report",
                       why="RabbitMQ 3.10 reports, at [error], a channel supervisor whose child stopped with the normal "
                           "reason shutdown, or was already gone (noproc), while an MQTT connection closed "
                           "(rabbitmq-partition-1: at the drain's disconnects, at SIGTERM, at a partition's timed-out "
                           "connection; docs/findings.md)", source=src),
            LogPattern("rabbitmq_crash", r"\[(?:error|critical)\] .*(?:CRASH REPORT|crasher:|Supervisor: )",
                       "fail", why="an Erlang process of RabbitMQ crashed", source=src),
            LogPattern("rabbitmq_error", r"\[(?:error|critical)\] ", "fail", why="RabbitMQ logged an error",
                       source=src),
            LogPattern("rabbitmq_warning", r"\[warning\] ", "report", why="RabbitMQ logged a warning", source=src))


def _ejabberd_log_patterns() -> tuple[LogPattern, ...]:
    # ejabberd 23.01 (Debian; its mod_mqtt) on its console: "<date> <time>+00:00 [error] message"; an Erlang
    # process's crash is "[error] ** Generic server <pid> terminating", "[error] CRASH REPORT:" and
    # "[error] SUPERVISOR REPORT:", each record with its continuation lines (ejabberd-cluster-kill: a
    # publisher's session process crashing in mod_mqtt_mnesia's routing while a peer node is down or
    # rejoining, its client then disconnected with "Internal server error", a [warning]).
    src = "default:ejabberd"
    return (LogPattern("ejabberd_crash", r"\[(?:error|critical)\] (?:\*\* Generic server |CRASH REPORT|SUPERVISOR REPORT)",
                       "fail", why="an Erlang process of ejabberd crashed", source=src),
            LogPattern("ejabberd_error", r"\[(?:error|critical|alert|emergency)\] ", "fail",
                       why="ejabberd logged an error", source=src),
            LogPattern("ejabberd_warning", r"\[warning\] ", "report", why="ejabberd logged a warning", source=src))


def default_log_preset(target_kind: str, start: tuple[str, ...] | list[str] = ()) -> str:
    """The preset a scenario gets when its [checks.logs] names none: the reference topology's, or for an
    external target the one its start program names (mosquitto, rabbitmq-server, ejabberdctl), else none."""
    if target_kind == "reference":
        return "reference"
    program = str(start[0]).rsplit("/", 1)[-1] if start else ""
    for preset in ("mosquitto", "rabbitmq", "ejabberd"):
        if preset in program:
            return preset
    return "none"


def default_log_patterns(preset: str, broker: dict | None = None) -> tuple[LogPattern, ...]:
    if preset == "reference":
        return _reference_log_patterns(dict(broker or {}))
    if preset == "mosquitto":
        return _mosquitto_log_patterns()
    if preset == "rabbitmq":
        return _rabbitmq_log_patterns()
    if preset == "ejabberd":
        return _ejabberd_log_patterns()
    if preset == "none":
        return ()
    raise ValueError(f"unknown log preset {preset!r}; expected one of {', '.join(LOG_PRESETS)}")


def effective_log_patterns(declared: tuple[LogPattern, ...], preset: str, broker: dict | None = None,
                           use_defaults: bool = True) -> tuple[LogPattern, ...]:
    """The scenario's patterns first (in order), then the preset's defaults that the scenario did not
    redefine by name: the first match decides a line, so a declared pattern overrides or narrows a default."""
    names = {p.name for p in declared}
    defaults = default_log_patterns(preset, broker) if use_defaults else ()
    return tuple(declared) + tuple(p for p in defaults if p.name not in names)


def log_pattern_from_mapping(value: object, where: str) -> LogPattern:
    """One pattern from a TOML table / JSON object; ValueError naming ``where`` and the key when it is wrong
    (an unknown key, a regex that does not compile, a verdict not in LOG_VERDICTS)."""
    import re

    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a table {{name, regex, verdict, roles, nodes, why}}, got {value!r}")
    known = {"name", "regex", "verdict", "roles", "nodes", "why", "source"}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; expected: {', '.join(sorted(known - {'source'}))}")
    for key in ("name", "regex"):
        if not isinstance(value.get(key), str) or not value.get(key):
            raise ValueError(f"{where}.{key} = {value.get(key)!r}: required, a non-empty string")
    try:
        re.compile(value["regex"])
    except re.error as error:
        raise ValueError(f"{where}.regex = {value['regex']!r}: not a valid regular expression ({error})") from None
    verdict = value.get("verdict", "fail")
    if verdict not in LOG_VERDICTS:
        raise ValueError(f"{where}.verdict = {verdict!r}: must be one of {', '.join(LOG_VERDICTS)}")
    lists = {}
    for key in ("roles", "nodes"):
        items = value.get(key, [])
        if not isinstance(items, list | tuple) or not all(isinstance(v, str) and v for v in items):
            raise ValueError(f"{where}.{key} = {items!r}: must be a list of non-empty strings")
        lists[key] = tuple(items)
    why = value.get("why", "")
    if not isinstance(why, str):
        raise ValueError(f"{where}.why = {why!r}: must be a string")
    return LogPattern(value["name"], value["regex"], verdict, lists["roles"], lists["nodes"], why,
                      str(value.get("source", "scenario")))
