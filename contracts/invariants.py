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


INVARIANTS: tuple[Invariant, ...] = (
    Invariant("durability.lost", "Owed message never delivered after the drain", needs_complete_history=True),
    Invariant("durability.lost_allowed", "Owed message lost to a fault the target never promised to survive "
              "(its declared persistence)", needs_complete_history=True, declared_allowance=True),
    Invariant("durability.session_lost", "Persistent session not present on reconnect"),
    Invariant("durability.session_returned", "A session the broker reported lost (session present 0) presented again "
              "on a later reconnect"),
    Invariant("durability.expired_session_present", "Session present 1 on a reconnect after the session's expiry "
              "interval had elapsed", mqtt5_only=True),
    Invariant("durability.session_lost_allowed", "Persistent session lost to a fault the target never promised to "
              "survive (its declared persistence)", declared_allowance=True),
    Invariant("durability.phantom", "Delivered but never published, or body differs from what was published"),
    Invariant("durability.unsubscribed_delivery", "Delivered to a client with no matching subscription"),
    Invariant("durability.discarded_session_delivery", "A discarded session's message delivered to a later session of "
              "its client id: acknowledged more than the pipeline slack before the connect that began the receiving "
              "session ([MQTT-3.1.2-4])"),
    Invariant("durability.delivered_after_failed_publish", "Delivered although its publish definitely failed"),
    Invariant("order.out_of_order", "First deliveries of a publisher's stream to a subscriber out of sequence"),
    Invariant("order.packet_id_invalid", "Packet id 0, missing or above 65535 on a QoS > 0 delivery"),
    Invariant("order.packet_id_reused", "Packet id reused for another message while still unacknowledged"),
    Invariant("order.dup_flag", "DUP set on a first delivery, or missing on a resend"),
    Invariant("order.resend_within_connection", "MQTT 5 PUBLISH resent within the connection it was sent on "
              "(resends only on a reconnect, [MQTT-4.4.0-1])"),
    Invariant("qos.upgraded", "Delivered at a higher QoS than it was published with"),
    Invariant("qos.above_grant", "Delivered at a higher QoS than every matching subscription was granted"),
    Invariant("qos.downgraded", "Delivered at a lower QoS than the minimum of its published QoS and the granted QoS"),
    Invariant("qos2.pubrel_not_resent", "A QoS 2 message the subscriber answered with PUBREC never released "
              "(PUBREL) after its session resumed", needs_complete_history=True, needs_v2=True),
    Invariant("expiry.property_missing", "MQTT 5 message published with a Message Expiry Interval forwarded without "
              "it", needs_v2=False, mqtt5_only=True),
    Invariant("props.forwarded_changed", "Payload format, content type, correlation data, response topic or user "
              "properties not forwarded unchanged", needs_v2=True, mqtt5_only=True),
    Invariant("props.subscription_ids", "Subscription identifiers of a delivery not those of the matching "
              "subscriptions", needs_v2=True, mqtt5_only=True),
    Invariant("props.retain_as_published", "RETAIN flag of a forwarded message not as the subscription's Retain As "
              "Published option requires"),
    Invariant("flow.receive_maximum", "More unacknowledged QoS > 0 PUBLISH packets sent to a client than its Receive "
              "Maximum", mqtt5_only=True),
    Invariant("flow.packet_too_large", "PUBLISH sent to a client larger than its Maximum Packet Size", needs_v2=True,
              mqtt5_only=True),
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
    Invariant("logs.error_lines", "No node's log shows a line the scenario's declared patterns fail (ERROR lines, "
              "\"committing anyway\", script errors, tracebacks, crashes)"),
    Invariant("logs.reported_lines", "Log lines the declared patterns report: counted and shown, never failing",
              reported_only=True),
    Invariant("health.unplanned_exit", "No node of the target exited outside every planned fault (a crash, an "
              "out-of-memory kill, a kill from outside the run)"),
    Invariant("health.unresponsive", "No node of the target stopped answering (its readiness probe failing for "
              "longer than the probe's grace) outside every planned fault"),
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
