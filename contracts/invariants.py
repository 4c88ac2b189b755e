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
# only against what its [target] declares (no limit and no TTL when it declares none; issue 12).
UNDECLARED_QUEUE_LIMIT = 10000
UNDECLARED_TTL_S = 604800
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


INVARIANTS: tuple[Invariant, ...] = (
    Invariant("durability.lost", "Owed message never delivered after the drain", needs_complete_history=True),
    Invariant("durability.lost_allowed", "Owed message lost to a fault the target never promised to survive "
              "(its declared persistence)", needs_complete_history=True, declared_allowance=True),
    Invariant("durability.session_lost", "Persistent session not present on reconnect"),
    Invariant("durability.session_lost_allowed", "Persistent session lost to a fault the target never promised to "
              "survive (its declared persistence)", declared_allowance=True),
    Invariant("durability.phantom", "Delivered but never published, or body differs from what was published"),
    Invariant("durability.unsubscribed_delivery", "Delivered to a client with no matching subscription"),
    Invariant("durability.delivered_after_failed_publish", "Delivered although its publish definitely failed"),
    Invariant("order.out_of_order", "First deliveries of a publisher's stream to a subscriber out of sequence"),
    Invariant("order.packet_id_invalid", "Packet id 0, missing or above 65535 on a QoS > 0 delivery"),
    Invariant("order.packet_id_reused", "Packet id reused for another message while still unacknowledged"),
    Invariant("order.dup_flag", "DUP set on a first delivery, or missing on a resend"),
    Invariant("order.resend_within_connection", "MQTT 5 PUBLISH resent within the connection it was sent on "
              "(resends only on a reconnect, [MQTT-4.4.0-1])"),
    Invariant("expiry.delivered_expired", "Delivered after its expiry (beyond the clock tolerance)"),
    Invariant("expiry.remaining_not_reduced", "MQTT 5 remaining expiry not reduced by the time it waited"),
    Invariant("expiry.dropped_early", "Message with an expiry interval dropped before it expired",
              needs_complete_history=True),
    Invariant("limits.over_limit", "More messages kept than the configured limit",
              queue_policies=("drop_oldest", "drop_newest", "reject")),
    Invariant("limits.trimmed_under_limit", "Trimmed more than needed: queue left under the limit",
              needs_complete_history=True, queue_policies=("drop_oldest", "drop_newest")),
    Invariant("limits.trim_not_oldest", "Trimmed messages were not the oldest (policy drop_oldest)",
              needs_complete_history=True, queue_policies=("drop_oldest",)),
    Invariant("limits.trim_not_newest", "Dropped messages were not the newest (policy drop_newest)",
              needs_complete_history=True, queue_policies=("drop_newest",)),
    Invariant("duplicates.redelivered_after_ack", "Redelivered after the subscriber acknowledged it"),
    Invariant("duplicates.qos2", "QoS 2 message delivered more than once"),
    Invariant("duplicates.backlog_twice_in_connection", "Message delivered twice within one connection, as two "
              "distinct deliveries (not a DUP resend)"),
    Invariant("whitebox.orphan_payloads", "Payload keys with no reference in the session ZSET", white_box=True),
    Invariant("whitebox.dangling_refs", "ZSET references whose payload key is gone", white_box=True),
    Invariant("whitebox.last_packet_id_behind", "Stored last packet id behind the highest stored id delivered",
              white_box=True),
    Invariant("whitebox.packet_id_sequence", "First-delivery packet ids of a persistent session skip a value "
              "(the reference broker allocates 1..65535 in order, then 1)", white_box=True),
    Invariant("liveness.unseen_over_time", "Owed-but-unseen messages over time", reported_only=True),
    Invariant("liveness.stuck_inflight", "Delivered QoS > 0 messages never acknowledged by the subscriber",
              reported_only=True),
    Invariant("meta.history_complete", "The history is complete and the drain ended quietly"),
    Invariant("meta.fault_bit", "Every scheduled fault applied and proved that it bit"),
    Invariant("meta.checker_error", "Every checker ran without error"),
)

BY_ID: dict[str, Invariant] = {invariant.id: invariant for invariant in INVARIANTS}
IDS: tuple[str, ...] = tuple(BY_ID)


def validate_ids(ids: list[str] | tuple[str, ...], where: str) -> tuple[str, ...]:
    """Reject unknown invariant ids with a message naming the place and the valid choices."""
    unknown = [value for value in ids if value not in BY_ID]
    if unknown:
        raise ValueError(f"{where}: unknown invariant id(s) {unknown}; expected ids from: {', '.join(IDS)}")
    return tuple(ids)
