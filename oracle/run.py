"""A stored run as the oracle reads it: every history row as a dict in seq order, what scenario.json declares,
and why the history cannot be read (``fatal``) or is not whole (``incomplete``).

Read with pyarrow, checked against contracts/history_schema.py; scenario.json is read here from its format
(docs/scenarios.md, docs/invariants.md "Declared guarantees"), not through the checkers' parser.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from contracts.app_clients import application_rules
from contracts.history_schema import (
    COLUMNS,
    EVENT_SCHEMA,
    MANIFEST_NAME,
    PARQUET_META_KEY,
    READABLE_VERSIONS,
    SCHEMA_VERSION,
    V2_COLUMNS,
)
from contracts.invariants import (
    DEFAULT_CLOCK_TOLERANCE_MS,
    DEFAULT_PIPELINE_SLACK_MS,
    UNDECLARED_QUEUE_LIMIT,
    UNDECLARED_TTL_S,
)
from contracts.scenario import UNPROMISED_FAULTS

# "No end": an offline window whose reconnect never came, a fault never healed.
NEVER = 1 << 62
# An external target that declares no queue limit keeps everything; one that declares no message lifetime
# keeps a message without an expiry interval for ever (100 years is for ever in a run).
NO_LIMIT = 2**31 - 1
NO_TTL_S = 100 * 365 * 86400
# The faults whose losses a declared persistence does not cover (docs/invariants.md durability.lost_allowed):
# the declaration's meaning, one table for the oracle and the checkers alike.
NOT_PROMISED = UNPROMISED_FAULTS


@dataclass(frozen=True)
class Declared:
    """What scenario.json declares for the checks."""

    limit: int = UNDECLARED_QUEUE_LIMIT
    ttl_s: int = UNDECLARED_TTL_S
    tolerance_ms: int = DEFAULT_CLOCK_TOLERANCE_MS
    slack_ms: int = DEFAULT_PIPELINE_SLACK_MS
    allowed: tuple[str, ...] = ()
    target_kind: str = "reference"
    queue_policy: str = "drop_oldest"
    persistence: str = "kill"
    target_names: tuple[str, ...] = ()  # the target's name and its nodes' names: a fault there hits the target
    # The reference broker's application_clients rules (contracts/app_clients.py): its APPLICATION clients.
    application_clients: tuple[dict[str, str], ...] = ()

    @property
    def tol(self) -> int:
        return self.tolerance_ms * 1000

    @property
    def slack(self) -> int:
        return self.slack_ms * 1000

    @property
    def ttl(self) -> int:
        return self.ttl_s * 1_000_000

    @property
    def white_box(self) -> bool:
        return self.target_kind == "reference"

    @property
    def trims(self) -> bool:
        """Whether the declared queue policy drops messages legally at all."""
        return self.queue_policy in ("drop_oldest", "drop_newest")

    def hits_target(self, node: str | None) -> bool:
        """A fault on ``node`` (None: unnamed; "a+b": several) is a fault of the target."""
        return not self.target_names or node is None or any(p in self.target_names for p in node.split("+"))

    def not_promised(self, kind: str) -> bool:
        return kind in NOT_PROMISED[self.persistence]


def declared_from(scenario: dict[str, Any]) -> Declared:
    """scenario.json's declarations, each absent key its documented default.  A reference target keeps the
    reference broker's limit and TTL ([broker]) and drops the oldest; an external one only what it declares."""
    broker = scenario.get("broker") or {}
    checks = scenario.get("checks") or {}
    target = scenario.get("target") or {}
    kind = target.get("kind", "reference")
    promises = target.get("promises") if isinstance(target.get("promises"), dict) else {}
    if kind == "external":
        policy = promises.get("queue_policy") or "none"
        limit = promises.get("queue_limit") or NO_LIMIT
        ttl = promises.get("message_ttl_s") or NO_TTL_S
    else:
        policy = "drop_oldest"
        limit = broker.get("persisted_messages_limit") or UNDECLARED_QUEUE_LIMIT
        ttl = broker.get("persisted_message_ttl_s") or UNDECLARED_TTL_S
    if policy == "none":
        limit = NO_LIMIT
    names = tuple(str(n.get("name")) for n in target.get("nodes") or () if isinstance(n, dict))
    if target.get("name"):
        names += (str(target["name"]),)
    tolerance = checks.get("clock_tolerance_ms")
    slack = checks.get("pipeline_slack_ms")
    return Declared(limit=limit, ttl_s=ttl,
                    tolerance_ms=DEFAULT_CLOCK_TOLERANCE_MS if tolerance is None else tolerance,
                    slack_ms=DEFAULT_PIPELINE_SLACK_MS if slack is None else slack,
                    allowed=tuple(checks.get("allowed") or ()), target_kind=kind, queue_policy=policy,
                    persistence=promises.get("persistence") or "kill", target_names=names,
                    application_clients=application_rules(broker) if kind == "reference" else ())


@dataclass(frozen=True)
class Run:
    directory: Path
    rows: tuple[dict[str, Any], ...] = ()  # every history row, in seq order
    declared: Declared | None = None
    version: int = SCHEMA_VERSION
    fatal: tuple[str, ...] = ()  # the history or scenario.json cannot be read: every verdict unknown
    incomplete: tuple[str, ...] = ()  # from the manifest; the phases add theirs (oracle/judge.py)
    manifest: dict[str, Any] = field(default_factory=dict)


def load(run_dir: str | Path) -> Run:
    """Read ``run_dir``: never raises for a broken history, which comes back with ``fatal`` saying why."""
    directory = Path(run_dir)
    fatal: list[str] = []
    declared = None
    try:
        scenario = json.loads((directory / "scenario.json").read_text())
        declared = declared_from(scenario)
    except (OSError, ValueError, AttributeError, TypeError) as error:
        fatal.append(f"{directory / 'scenario.json'}: {type(error).__name__}: {error}")
    history = directory / "history"
    try:
        manifest = json.loads((history / MANIFEST_NAME).read_text())
    except (OSError, ValueError) as error:
        return Run(directory, declared=declared, fatal=(*fatal, f"{history / MANIFEST_NAME}: {error}"))
    version = manifest.get("schema_version")
    if version not in READABLE_VERSIONS:
        fatal.append(f"{history / MANIFEST_NAME}: schema_version {version!r}, readable: {READABLE_VERSIONS}")
    incomplete = []
    if manifest.get("complete") is not True:
        incomplete.append(f"{history / MANIFEST_NAME}: complete = {manifest.get('complete')!r}")
    rows: list[dict[str, Any]] = []
    for name in manifest.get("parts") or []:
        path = history / str(name)
        try:
            table = pq.read_table(path)
        except (OSError, ValueError) as error:
            fatal.append(f"{path}: {type(error).__name__}: {error}")
            continue
        part_version = (table.schema.metadata or {}).get(PARQUET_META_KEY)
        if part_version is not None and part_version not in {str(v).encode() for v in READABLE_VERSIONS}:
            fatal.append(f"{path}: Parquet metadata schema version {part_version!r}")
        optional = V2_COLUMNS if part_version == b"1" or version == 1 else ()
        missing = [c for c in COLUMNS if c not in table.schema.names and c not in optional]
        wrong = [c for c in COLUMNS if c in table.schema.names
                 and table.schema.field(c).type != EVENT_SCHEMA.field(c).type]
        if missing or wrong:
            fatal.append(f"{path}: missing columns {missing}, wrong types {wrong}")
            continue
        for row in table.to_pylist():
            rows.append({c: row.get(c) for c in COLUMNS})
    if not manifest.get("parts"):
        fatal.append(f"{history / MANIFEST_NAME}: no parts listed")
    if not fatal and isinstance(manifest.get("rows"), int) and manifest["rows"] != len(rows):
        incomplete.append(f"{history / MANIFEST_NAME}: says {manifest['rows']} rows, the parts hold {len(rows)}")
    rows.sort(key=lambda r: r["seq"])
    return Run(directory, tuple(rows), declared, version if isinstance(version, int) else SCHEMA_VERSION,
               tuple(fatal), tuple(incomplete), manifest)


def detail(row: dict[str, Any]) -> dict[str, Any]:
    """A row's detail JSON object ({} when absent or not an object)."""
    try:
        value = json.loads(row.get("detail") or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
