"""What a run promised: the scenario's declared guarantees that every checker decides against."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from contracts.app_clients import application_rules
from contracts.invariants import (
    DEFAULT_CLOCK_TOLERANCE_MS,
    DEFAULT_PIPELINE_SLACK_MS,
    MAX_QUEUE_LIMIT,
    UNDECLARED_QUEUE_LIMIT,
    UNDECLARED_TTL_S,
    LogPattern,
    default_log_preset,
    effective_log_patterns,
    log_pattern_from_mapping,
    validate_ids,
)
from contracts.scenario import PERSISTENCE_PROMISES, QUEUE_POLICIES, TARGET_KINDS, UNPROMISED_FAULTS
from contracts.versions import check_version

# Every default lives in contracts/invariants.py; the names here are the ones the checker reads.
DEFAULT_LIMIT, MAX_LIMIT, DEFAULT_TTL_S = UNDECLARED_QUEUE_LIMIT, MAX_QUEUE_LIMIT, UNDECLARED_TTL_S
NO_LIMIT = 2**31 - 1  # policy "none": nothing is ever legally trimmed and nothing is over the limit
NO_TTL_S = 100 * 365 * 86400  # no broker-side lifetime declared: a message without expiry never expires


@dataclass(frozen=True)
class Guarantees:
    persisted_messages_limit: int = DEFAULT_LIMIT
    persisted_message_ttl_s: int = DEFAULT_TTL_S
    clock_tolerance_ms: int = DEFAULT_CLOCK_TOLERANCE_MS
    allowed: tuple[str, ...] = ()
    target_kind: str = "reference"
    source: str = "defaults"  # where these came from, for the report
    notes: tuple[str, ...] = field(default=())
    pipeline_slack_ms: int = DEFAULT_PIPELINE_SLACK_MS
    # What the target declared (scenario.json target.promises; the reference broker's from its [broker]).
    queue_policy: str = "drop_oldest"
    persistence: str = "kill"
    target_name: str = ""
    # Every node of the target (an external cluster's [[target.nodes]], else its one node: target_name): a
    # fault on any of them is a fault of the target its declared persistence speaks of.
    target_nodes: tuple[str, ...] = ()
    mqtt_versions: tuple[str, ...] = ("3.1.1", "5")
    fault_mix: tuple[str, ...] = ()  # the scenario's fault kinds (a mix that produced no fault is noted)
    # The log oracle: the patterns every node's log is judged by, in the order they are tried (scenario.json
    # checks.logs.effective), and the preset they came from.
    log_patterns: tuple[LogPattern, ...] = ()
    log_preset: str = ""
    # An external target's [target.credentials] (any user name declared) and [target.tls] (enabled); None for
    # the reference broker, which declares neither.  Shown in the report's declaration, never judged.
    credentials: bool | None = None
    tls: bool | None = None
    # The reference broker's application_clients rules (scenario.json broker; contracts/app_clients.py): which
    # subscribers are APPLICATION clients, whose packet ids are not lua/save.lua's.  Empty for an external target.
    application_clients: tuple[dict[str, str], ...] = ()

    @property
    def unpromised_faults(self) -> tuple[str, ...]:
        return UNPROMISED_FAULTS[self.persistence]

    def of_target(self, node: str | None) -> bool:
        """Whether a fault on ``node`` (None: no named node; "a+b": each node of a set) hits the target."""
        names = set(self.target_nodes) | ({self.target_name} if self.target_name else set())
        return not names or node is None or any(part in names for part in node.split("+"))

    @property
    def white_box(self) -> bool:
        return self.target_kind == "reference"

    @property
    def ttl_us(self) -> int:
        return self.persisted_message_ttl_s * 1_000_000

    @property
    def tolerance_us(self) -> int:
        return self.clock_tolerance_ms * 1000

    @property
    def slack_us(self) -> int:
        return self.pipeline_slack_ms * 1000

    def to_dict(self) -> dict[str, Any]:
        return {
            "persisted_messages_limit": self.persisted_messages_limit,
            "persisted_message_ttl_s": self.persisted_message_ttl_s,
            "clock_tolerance_ms": self.clock_tolerance_ms,
            "pipeline_slack_ms": self.pipeline_slack_ms,
            "allowed": list(self.allowed),
            "target_kind": self.target_kind,
            "source": self.source,
            "promises": {"queue_limit": None if self.queue_policy == "none" else self.persisted_messages_limit,
                         "queue_policy": self.queue_policy, "persistence": self.persistence,
                         "message_ttl_s": None if self.persisted_message_ttl_s == NO_TTL_S
                         else self.persisted_message_ttl_s,
                         "mqtt_versions": list(self.mqtt_versions),
                         "losses_allowed_after": list(self.unpromised_faults)},
            "logs": {"preset": self.log_preset, "patterns": [p.to_dict() for p in self.log_patterns]},
            "target_name": self.target_name, "target_nodes": list(self.target_nodes),
            "credentials": self.credentials, "tls": self.tls,
        }

    @classmethod
    def from_scenario(cls, scenario: Mapping[str, Any], source: str = "scenario.json") -> Guarantees:
        """Build from a normalised scenario dict; missing keys take the documented defaults."""
        if not isinstance(scenario, Mapping):
            raise ValueError(f"{source}: expected a JSON object at the top level, got {type(scenario).__name__}")
        check_version(dict(scenario), source, "scenario.json")  # an unknown version: refused, naming the file
        broker = _section(scenario, "broker", source)
        checks = _section(scenario, "checks", source)
        target = _section(scenario, "target", source)
        limit = _int(broker, "persisted_messages_limit", DEFAULT_LIMIT, f"{source}: broker", 1, MAX_LIMIT)
        ttl = _int(broker, "persisted_message_ttl_s", DEFAULT_TTL_S, f"{source}: broker", 1, None)
        tolerance = _int(checks, "clock_tolerance_ms", DEFAULT_CLOCK_TOLERANCE_MS, f"{source}: checks", 0, None)
        slack = _int(checks, "pipeline_slack_ms", DEFAULT_PIPELINE_SLACK_MS, f"{source}: checks", 0, None)
        allowed_raw = checks.get("allowed", [])
        if not isinstance(allowed_raw, list | tuple) or not all(isinstance(v, str) for v in allowed_raw):
            raise ValueError(f"{source}: checks.allowed must be a list of invariant ids, got {allowed_raw!r}")
        allowed = validate_ids(tuple(allowed_raw), f"{source}: checks.allowed")
        kind = target.get("kind", "reference")
        if kind not in TARGET_KINDS:
            raise ValueError(f"{source}: target.kind must be one of {TARGET_KINDS}, got {kind!r}")
        faults = _section(scenario, "faults", source)
        mix = tuple(sorted(k for k, w in (faults.get("mix") or {}).items() if w)) if isinstance(
            faults.get("mix"), Mapping) else ()
        promises = target.get("promises")
        if kind == "external":
            # A black box promises only what it declares: no reference-broker limit or TTL applies to it.
            promises = promises if isinstance(promises, Mapping) else {}
            policy = promises.get("queue_policy") or "none"
            limit = promises.get("queue_limit") or NO_LIMIT
            ttl = promises.get("message_ttl_s") or NO_TTL_S
        else:
            policy = "drop_oldest"
            promises = promises if isinstance(promises, Mapping) else {}
        persistence = promises.get("persistence") or "kill"
        if policy not in QUEUE_POLICIES:
            raise ValueError(f"{source}: target.promises.queue_policy must be one of {QUEUE_POLICIES}, got {policy!r}")
        if persistence not in PERSISTENCE_PROMISES:
            raise ValueError(f"{source}: target.promises.persistence must be one of {PERSISTENCE_PROMISES}, "
                             f"got {persistence!r}")
        if policy == "none":
            limit = NO_LIMIT
        versions = tuple(promises.get("mqtt_versions") or ("3.1.1", "5"))
        preset, patterns = _log_patterns(checks, target, broker, kind, source)
        return cls(limit, ttl, tolerance, allowed, kind, source, pipeline_slack_ms=slack, queue_policy=policy,
                   persistence=persistence, target_name=str(target.get("name") or ""),
                   target_nodes=tuple(str(n.get("name")) for n in target.get("nodes") or () if isinstance(n, Mapping)),
                   mqtt_versions=versions,
                   fault_mix=mix, log_patterns=patterns, log_preset=preset,
                   credentials=bool(target.get("credentials")) if kind == "external" else None,
                   tls=bool((target.get("tls") or {}).get("enabled")) if kind == "external" else None,
                   application_clients=application_rules(broker, source) if kind == "reference" else ())


def _log_patterns(checks: Mapping[str, Any], target: Mapping[str, Any], broker: Mapping[str, Any], kind: str,
                  source: str) -> tuple[str, tuple[LogPattern, ...]]:
    """checks.logs.effective as written by the run; a scenario.json without it (written before the log oracle)
    gets the target's defaults, computed by the same function the run uses (contracts/invariants.py)."""
    logs = checks.get("logs")
    if logs is None:
        start = target.get("start") if isinstance(target.get("start"), list) else []
        preset = default_log_preset(kind, start)
        return preset, effective_log_patterns((), preset, dict(broker))
    if not isinstance(logs, Mapping) or not isinstance(logs.get("effective"), list):
        raise ValueError(f"{source}: checks.logs must be an object with an 'effective' list of patterns, got {logs!r}")
    patterns = tuple(log_pattern_from_mapping(dict(p) if isinstance(p, Mapping) else p,
                                              f"{source}: checks.logs.effective[{i}]")
                     for i, p in enumerate(logs["effective"]))
    return str(logs.get("preset") or ""), patterns


def _section(scenario: Mapping[str, Any], name: str, source: str) -> Mapping[str, Any]:
    value = scenario.get(name, {})
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{source}: '{name}' must be a table/object, got {type(value).__name__}")
    return value


def _int(section: Mapping[str, Any], key: str, default: int, where: str, low: int, high: int | None) -> int:
    value = section.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}.{key} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise ValueError(f"{where}.{key} must be {bound}, got {value}")
    return value
