"""What a run promised: the scenario's declared guarantees that every checker decides against."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from contracts.invariants import (
    DEFAULT_CLOCK_TOLERANCE_MS,
    DEFAULT_PIPELINE_SLACK_MS,
    MAX_QUEUE_LIMIT,
    UNDECLARED_QUEUE_LIMIT,
    UNDECLARED_TTL_S,
    validate_ids,
)
from contracts.scenario import TARGET_KINDS
from contracts.versions import check_version

# Every default lives in contracts/invariants.py; the names here are the ones the checker reads.
DEFAULT_LIMIT, MAX_LIMIT, DEFAULT_TTL_S = UNDECLARED_QUEUE_LIMIT, MAX_QUEUE_LIMIT, UNDECLARED_TTL_S


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
        return cls(limit, ttl, tolerance, allowed, kind, source, pipeline_slack_ms=slack)


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
