"""Scenario files: TOML in, frozen dataclasses out, validated on load.

Every error names the file, the ``[section] key``, the offending value and what is allowed, so the user
knows what to change.  Unknown sections and keys are rejected (a typo must not silently fall back to a
default).  ``Scenario.to_dict()`` is the normalised form (every default filled in) written as
``scenario.json`` in the run directory.  See docs/scenarios.md for every key.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from contracts.app_clients import application_rules, is_application
from contracts.credentials import Credentials, read_credentials
from contracts.errors import UsageError
from contracts.invariants import (
    DEFAULT_CLOCK_TOLERANCE_MS,
    DEFAULT_PIPELINE_SLACK_MS,
    IDS,
    LOG_PRESETS,
    LogPattern,
    default_log_preset,
    effective_log_patterns,
    log_pattern_from_mapping,
)
from contracts.target_nodes import (
    BROKER,
    HOME_NODE_POLICIES,
    READY_CHECKS,
    SERVICE,
    FormationSpec,
    NodeSpec,
    harness_data_dirs,
    read_env,
    read_files,
    read_formation,
    read_host,
    read_name,
    read_nodes,
)
from contracts.tls import TlsSpec, read_tls
from contracts.validation import Section, nonzero_total

TIERS = ("smoke", "nightly", "soak")
TARGET_KINDS = ("reference", "external")
PATTERNS = ("p2p", "fan-in")
# The filter a shared group subscribes to under each pattern: every publisher's topic (properties/generate.py).
SHARED_FILTERS = {"p2p": "europe/ua/kyiv/+/0", "fan-in": "europe/ua/kyiv/fanin/+"}
QOS_KEYS = {"qos0": 0, "qos1": 1, "qos2": 2}
PROTOCOL_KEYS = {"mqtt311": 4, "mqtt5": 5}
RECONNECT_NODES = ("same", "other", "any")
# [scenario] resource_sample_s: how often the harness samples its own resources while the workload runs
# (harness/resources.py, <run dir>/resources.jsonl); 0 turns the sampler off.
DEFAULT_RESOURCE_SAMPLE_S = 5.0
MAX_RESOURCE_SAMPLE_S = 3600.0


# --------------------------------------------------------------------------------------------------
# What the stages register into the model.  This module imports no stage (it is the bottom layer): the
# fault kinds belong to faults/ (faults/catalog.py registers them at import), the [topology] table to the
# harness (harness/topology_config.py registers it), the [broker] table to the reference broker (registered
# by harness/model.py).  Whoever loads a scenario imports harness.model first (ordeal's commands do).
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultCatalog:
    """The fault-kind knowledge the scenario model validates [faults] against (faults/catalog.py)."""

    kinds: tuple[str, ...]
    target_type: Callable[[str], str]  # kind -> "node" | "client" | "none"
    validate: Callable[[Mapping[str, Any]], Any]  # a plan fault dict; raises ValueError naming what is wrong
    full_params: Callable[[str, Mapping[str, Any]], dict[str, Any]]  # every parameter, defaults filled
    default_targets: Mapping[str, tuple[str, ...]]  # kind -> selectors drawn when the scenario names none
    log_losing_kinds: tuple[str, ...]  # kinds that take a node down (an in-memory Kafka log is lost)
    kafka_role_of: Callable[[str], str | None]  # selector -> 'kafka' | 'storage' | None
    # (kind, selectors, parameter variants, the target's (node name, role) pairs) -> why the fault cannot apply
    # to that external target (its nodes and its clients), naming the key: "targets.K = 'x': ..." /
    # "params.K.a = ...: ..."; or ''
    external_refusal: Callable[[str, tuple[str, ...], list[Mapping[str, Any]], tuple[tuple[str, str], ...]],
                               str] = lambda *args: ""
    # (provider, kinds) -> one sentence per kind that topology provider cannot play (empty: all supported)
    provider_gaps: Callable[[str, Iterable[str]], list[str]] = lambda provider, kinds: []
    # (provider, kind, parameters) -> why that provider cannot play a kind it supports with those parameters, or ''
    provider_param_gaps: Callable[[str, str, Mapping[str, Any]], str] = lambda provider, kind, params: ""


@dataclass(frozen=True)
class TopologyModel:
    """The [topology] table's validation (harness/topology_config.py)."""

    normalise: Callable[[Mapping[str, Any], str], dict[str, Any]]  # (mapping, source) -> every key filled
    kill_loses_log: Callable[[Mapping[str, Any], str], str]  # (normalised, 'kafka'|'storage') -> why, or ''


_FAULTS: list[FaultCatalog] = []
_TOPOLOGY: list[TopologyModel] = []
_BROKER: list[Callable[[Mapping[str, Any], str], Any]] = []


def register_fault_catalog(catalog: FaultCatalog) -> None:
    _FAULTS[:] = [catalog]


def register_topology_model(model: TopologyModel) -> None:
    _TOPOLOGY[:] = [model]


def register_broker_validator(validate: Callable[[Mapping[str, Any], str], dict[str, Any]]) -> None:
    """``validate(table, source)`` raises ValueError/TypeError naming the key when [broker] is wrong, else
    returns the reference broker's whole configuration (every default filled: scenario.json's "broker")."""
    _BROKER[:] = [validate]


def _registered(registry: list[Any], what: str) -> Any:
    if not registry:
        raise RuntimeError(f"the scenario model has no {what} registered: import harness.model before loading "
                           "or planning a scenario (contracts/ imports no stage; the stages register into it)")
    return registry[0]


def fault_catalog() -> FaultCatalog:
    return _registered(_FAULTS, "fault catalog (faults/catalog.py)")


def topology_model() -> TopologyModel:
    return _registered(_TOPOLOGY, "topology model (harness/topology_config.py)")


def known_fault_kinds() -> tuple[str, ...]:
    """The fault kinds the nemesis implements.  A scenario naming any other kind is rejected on load, never
    silently run without it."""
    return tuple(sorted(fault_catalog().kinds))


# The invariant vocabulary (scenarios' checks.allowed uses these ids): contracts/invariants.py.
INVARIANT_IDS: tuple[str, ...] = IDS

MIN_PAYLOAD_SIZE = 32  # the identity header (contracts/payload.py) is 23 bytes; architecture.md fixes 32
MAX_PACKET_ID = 65535


class ScenarioError(UsageError):
    """A scenario file that cannot be used; the message says where and what to change."""


# --------------------------------------------------------------------------------------------------
# The dataclasses
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScenarioInfo:
    name: str
    description: str
    tier: str
    duration_s: float
    drain_quiet_s: float
    drain_timeout_s: float
    resource_sample_s: float = DEFAULT_RESOURCE_SAMPLE_S


MQTT_VERSIONS = {"3.1.1": 4, "5": 5}  # the names a target declares -> the protocol level a CONNECT carries
QUEUE_POLICIES = ("none", "drop_oldest", "drop_newest", "reject")
PERSISTENCE_PROMISES = ("power", "kill", "graceful", "none")
# The faults whose losses each declared persistence does not cover (a loss to them is allowed, not a violation):
# "power" survives a power loss of the target's storage nodes (writes fsynced before the acknowledgement),
# "kill" a SIGKILL but not a power loss (what the page cache holds survives), "graceful" only a graceful stop.
UNPROMISED_FAULTS: dict[str, tuple[str, ...]] = {
    "power": (),
    "kill": ("power_loss",),
    "graceful": ("process_kill", "power_loss"),
    "none": ("process_kill", "process_stop", "process_restart", "power_loss"),
}


@dataclass(frozen=True)
class TargetSpec:
    """Which broker is under test.  ``reference``: the local topology with reference-broker nodes.
    ``external``: any MQTT broker at host:port, started / stopped / killed with the given argv lists.
    Placeholders in argv, env values and config files: {run_dir} {data_dir} {log_dir} {host} {port} {pid}.

    What the target promises (docs/scenarios.md, "What a target promises"), judged by the checkers:
    ``mqtt_versions`` the protocol levels it speaks; ``queue_limit`` / ``queue_policy`` its per-session queue
    (policy "none": no limit declared, the limit rules are not applicable and no trimming is legal);
    ``persistence`` which stop an acknowledged message survives ("power": even a power loss of its storage,
    "kill": a SIGKILL but not a power loss, "graceful": only a graceful stop, "none": neither: UNPROMISED_FAULTS); ``message_ttl_s`` a broker-side message lifetime (0: none).  For the
    reference target these come from its [broker] configuration (reference_declaration).

    ``credentials`` ([target.credentials], contracts/credentials.py): the user name and password every MQTT
    connection of the run sends (workload clients, readiness and protocol probes); empty = anonymous.  The
    reference broker accepts anonymous clients, so only an external target takes them."""

    kind: str = "reference"
    name: str = "broker"
    host: str = ""  # "" = the run picks one: its own 127.0.0.x inside a private namespace, else 127.0.0.1
    port: int = 0  # 0 = pick a free loopback port at run time
    start: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()  # empty = SIGTERM to the started process group
    kill: tuple[str, ...] = ()  # empty = SIGKILL to the started process group
    config_file: str = ""  # written to {run_dir}/<config_file> from config_text before start
    config_text: str = ""
    files: tuple[tuple[str, str], ...] = ()  # more config files: (name under {run_dir}, text)
    env: tuple[tuple[str, str], ...] = ()  # environment variables for start / stop / kill
    data_owner: str = ""  # chown {data_dir} and {log_dir} to this user (a daemon that drops root)
    ready_timeout_s: float = 10.0
    ready: str = "mqtt"  # "mqtt": an MQTT CONNECT gets a CONNACK; "port": the port accepts TCP
    mqtt_versions: tuple[str, ...] = ("3.1.1", "5")
    queue_limit: int = 0  # 0 = none declared
    queue_policy: str = "none"
    persistence: str = "kill"
    message_ttl_s: int = 0  # 0 = messages without an expiry interval never expire
    credentials: Credentials = Credentials()
    tls: TlsSpec = TlsSpec()  # [target.tls] (contracts/tls.py): every MQTT connection over TLS, the run's CA
    nodes: tuple[NodeSpec, ...] = ()  # [[target.nodes]] as declared; () = one node, named like the target
    formation: FormationSpec = FormationSpec()  # [target.formation]: joining the nodes into one cluster

    @property
    def clustered(self) -> bool:
        return bool(self.nodes)

    def node_specs(self) -> tuple[NodeSpec, ...]:
        """Every node with the target's keys filled in where it gives none (env and files merged over the
        target's).  One node named like the target when [[target.nodes]] is absent."""
        declared = self.nodes or (NodeSpec(name=self.name, host=self.host, port=self.port),)
        resolved = []
        for node in declared:
            service = node.role == SERVICE
            resolved.append(NodeSpec(
                name=node.name, role=node.role, host=node.host, port=node.port,
                start=node.start or self.start, stop=node.stop or self.stop, kill=node.kill or self.kill,
                env=tuple(sorted({**dict(self.env), **dict(node.env)}.items())),
                files=tuple(sorted({**dict(self.files), **dict(node.files)}.items())),
                ready=node.ready or ("port" if service else self.ready),
                ready_timeout_s=node.ready_timeout_s if node.ready_timeout_s is not None else self.ready_timeout_s))
        return tuple(resolved)

    def broker_node_names(self) -> tuple[str, ...]:
        """The MQTT listeners the clients connect to, in declaration order (node index 0, 1, ...)."""
        return tuple(node.name for node in self.node_specs() if node.role == BROKER)

    @property
    def protocol_levels(self) -> tuple[int, ...]:
        return tuple(MQTT_VERSIONS[v] for v in self.mqtt_versions)

    def declaration(self) -> dict[str, Any]:
        """What the target promises, as the checkers and the report read it (scenario.json target.promises)."""
        return {"mqtt_versions": list(self.mqtt_versions), "queue_limit": self.queue_limit or None,
                "queue_policy": self.queue_policy, "persistence": self.persistence,
                "message_ttl_s": self.message_ttl_s or None}


@dataclass(frozen=True)
class WorkloadSpec:
    pattern: str = "p2p"
    pairs: int = 1  # p2p: publisher i -> subscriber i
    publishers: int = 1  # fan-in: many publishers ...
    subscribers: int = 1  # ... to every subscriber
    rate_per_publisher: float = 1.0  # messages per second
    qos_mix: tuple[tuple[int, float], ...] = ((1, 1.0),)
    payload_size: int = 62
    protocol_mix: tuple[tuple[int, float], ...] = ((4, 1.0),)
    expiry_mix: tuple[tuple[int | None, float], ...] = ((None, 1.0),)  # None = no expiry interval
    preset_last_packet_id: int = 0  # 0 = no preset; else the subscribers' sessions start here
    # White box: the preset again shortly before each planned subscriber disconnect (queue empty), so every
    # offline backlog (not only the first) crosses the packet-id wrap (harness/snapshot.py).
    preset_each_offline: bool = False
    subscription_qos: int = 1
    # Publishers reconnecting mid-stream (Poisson, like the subscribers): each drop is followed by an offline
    # time and a clean-start reconnect; what a publisher publishes while offline fails ("never sent").
    publisher_disconnects_per_minute: float = 0.0
    publisher_abrupt_fraction: float = 0.5
    publisher_offline_s: tuple[float, float] = (0.2, 1.0)
    # Each client's first node: "round-robin" over the broker nodes in order, or "seeded" (drawn per client);
    # ``home_nodes`` fixes it per client id (client id -> broker node name).
    home_node: str = "round-robin"
    home_nodes: tuple[tuple[str, str], ...] = ()
    # MQTT 5 delivery options (docs/scenarios.md "MQTT 5 properties and flow control"): the publishers send the
    # forwarded properties (contracts/mqtt_properties.py), each subscriber's SUBSCRIBE carries a subscription
    # identifier (its index + 1) and the Retain As Published option, its CONNECT a Receive Maximum and a
    # Maximum Packet Size (None: not sent).  Only MQTT 5 clients send them.
    mqtt5_properties: bool = False
    subscription_identifiers: bool = False
    retain_as_published: bool = False
    receive_maximum: int | None = None
    maximum_packet_size: int | None = None
    # Will and retained messages (docs/scenarios.md [workload]; properties/generate.py WillSpec,
    # RetainedSpec): a share of the subscribers connecting with a Will, the MQTT 5 Will Delay Interval drawn per
    # client (None: none sent), a share of the publishes sent with RETAIN 1 to one of retained_topics topics, and
    # late_subscribers subscribing to them late in the workload.  0: off (nothing drawn, plans unchanged).
    wills: float = 0.0
    will_delay_mix: tuple[tuple[int | None, float], ...] = ((None, 1.0),)
    retained: float = 0.0
    retained_topics: int = 2
    late_subscribers: int = 2
    # Shared subscriptions (MQTT 5 §4.8.2, docs/scenarios.md [workload]): shared_groups groups of shared_members
    # persistent members each, member m of group g (client test_share_client_<g>_<m>) subscribing
    # $share/g<g>/<the filter of every publisher's topic> (SHARED_FILTERS); they leave, rejoin and crash as the
    # [subscribers] table draws for every subscriber.  0: off (nothing drawn, plans unchanged).
    shared_groups: int = 0
    shared_members: int = 3
    # Fan-in beside P2P in one run (p2p only): this many more persistent subscribers test_fanin_sub_client_<k>_0,
    # each on the filter of every publisher's topic (SHARED_FILTERS["p2p"]): TBMQ's fan-in subscribers (on the
    # reference broker APPLICATION clients when [broker] application_clients says so).  0: none.
    fan_in_subscribers: int = 0

    def client_ids(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(publisher ids, subscriber ids), the names every plan of this workload gives its clients."""
        if self.pattern == "p2p":
            return (tuple(f"test_pub_client_{i}_0" for i in range(self.pairs)),
                    tuple(f"test_sub_client_{i}_0" for i in range(self.pairs)))
        return (tuple(f"test_pub_client_{j}_0" for j in range(self.publishers)),
                tuple(f"test_sub_client_{k}_0" for k in range(self.subscribers)))

    def fan_in_subscribers_of(self) -> tuple[tuple[str, str], ...]:
        """(client id, filter) of the fan-in subscribers a P2P workload adds (``fan_in_subscribers``)."""
        return tuple((f"test_fanin_sub_client_{k}_0", SHARED_FILTERS[self.pattern])
                     for k in range(self.fan_in_subscribers))

    def shared_members_of(self) -> tuple[tuple[str, str], ...]:
        """(member client id, its $share filter) of every shared group's members, group by group."""
        topic_filter = SHARED_FILTERS[self.pattern]
        return tuple((f"test_share_client_{g}_{m}", f"$share/g{g}/{topic_filter}")
                     for g in range(self.shared_groups) for m in range(self.shared_members))


@dataclass(frozen=True)
class SubscriberSpec:
    disconnects_per_minute: float = 0.0
    abrupt_fraction: float = 0.5
    clean_start_fraction: float = 0.0
    session_expiry_s: int = 3600
    # MQTT 5: the Session Expiry Interval each reconnect asks for, drawn per connect (seconds -> weight);
    # empty = always session_expiry_s.  0 ends the session at the disconnect (with clean start 0 the
    # reference broker, like TBMQ, keeps it for ever instead), a few seconds expire it while offline.
    session_expiry_mix: tuple[tuple[int, float], ...] = ()
    offline_s: tuple[float, float] = (1.0, 3.0)
    reconnect_node: str = "any"
    # Before each abrupt disconnect the subscriber withholds its PUBACKs this long (0 = never): what it
    # receives then is unacknowledged when the socket drops, so a resumed session owes a resend (DUP = 1).
    withhold_acks_s: float = 0.0


@dataclass(frozen=True)
class FaultSpec:
    """The scenario's fault mix and how the plan generator turns it into a schedule (properties/generate.py).

    ``targets``: per kind, the selectors a fault of that kind draws from (``{subscriber}`` = a subscriber
    the plan keeps connected during the fault); ``params``: per kind, fixed parameters; ``choices``: per
    kind, parameter -> values drawn per fault.  Kinds needing a node target default to faults/catalog.py DEFAULT_TARGETS."""

    mix: tuple[tuple[str, float], ...] = ()
    quiet_s: tuple[float, float] = (2.0, 5.0)
    duration_s: tuple[float, float] = (1.0, 5.0)
    tail_s: float = 2.0  # the workload's last seconds are fault-free: every fault ends before them
    max_faults: int = 0  # 0 = as many as fit
    targets: tuple[tuple[str, tuple[str, ...]], ...] = ()
    params: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    choices: tuple[tuple[str, tuple[tuple[str, tuple[Any, ...]], ...]], ...] = ()

    def targets_of(self, kind: str) -> tuple[str, ...]:
        return dict(self.targets).get(kind, ())

    def params_of(self, kind: str) -> dict[str, Any]:
        return dict(dict(self.params).get(kind, {}))

    def choices_of(self, kind: str) -> tuple[tuple[str, tuple[Any, ...]], ...]:
        return dict(self.choices).get(kind, ())


@dataclass(frozen=True)
class LogSpec:
    """[checks.logs]: which lines of the nodes' logs the run is judged by (docs/scenarios.md).  ``preset``:
    the default patterns ("" = the target's: contracts/invariants.py default_log_preset); ``defaults``: false
    drops them; ``patterns``: the scenario's own, tried before the defaults (the first match decides a line;
    a pattern named like a default replaces it)."""

    preset: str = ""
    defaults: bool = True
    patterns: tuple[LogPattern, ...] = ()


@dataclass(frozen=True)
class CheckSpec:
    clock_tolerance_ms: int = DEFAULT_CLOCK_TOLERANCE_MS  # defaults: contracts/invariants.py
    pipeline_slack_ms: int = DEFAULT_PIPELINE_SLACK_MS
    allowed: tuple[str, ...] = ()
    logs: LogSpec = LogSpec()


@dataclass(frozen=True)
class Scenario:
    source: str
    scenario: ScenarioInfo
    topology: Mapping[str, Any]  # normalised [topology]; empty for an external target (nothing local)
    target: TargetSpec
    broker: Mapping[str, Any] = field(default_factory=dict)
    workload: WorkloadSpec = WorkloadSpec()
    subscribers: SubscriberSpec = SubscriberSpec()
    faults: FaultSpec = FaultSpec()
    checks: CheckSpec = CheckSpec()

    @property
    def name(self) -> str:
        return self.scenario.name

    def broker_nodes(self) -> tuple[str, ...]:
        """The broker nodes clients connect to, by index: broker-1..N of the reference topology, or the
        external target's broker nodes in declaration order."""
        if self.target.kind == "reference":
            return tuple(f"broker-{n}" for n in range(1, int(self.topology.get("broker_nodes", 1)) + 1))
        return self.target.broker_node_names()

    def broker_config(self) -> dict[str, Any]:
        """The reference broker's whole configuration for this scenario: the [broker] table with the broker's
        own defaults filled in (so the checker judges limits and TTLs against the broker's values, and keeps
        no copy of them)."""
        validate = _registered(_BROKER, "broker validator (harness/model.py)")
        return _plain(validate(self.broker, f"{self.source} [broker]"))

    @property
    def log_preset(self) -> str:
        return self.checks.logs.preset or default_log_preset(self.target.kind, self.target.start)

    def log_patterns(self) -> tuple[LogPattern, ...]:
        """Every pattern the nodes' logs are judged by, in the order they are tried (scenario.json
        checks.logs.effective)."""
        broker = self.broker_config() if self.target.kind == "reference" else {}
        return effective_log_patterns(self.checks.logs.patterns, self.log_preset, broker, self.checks.logs.defaults)

    def to_dict(self) -> dict[str, Any]:
        """The normalised scenario, JSON-able, every default filled in (written as scenario.json)."""
        workload = asdict(self.workload)
        workload["qos_mix"] = {f"qos{q}": w for q, w in self.workload.qos_mix}
        workload["protocol_mix"] = {_protocol_key(p): w for p, w in self.workload.protocol_mix}
        workload["expiry_mix"] = {("none" if e is None else str(e)): w for e, w in self.workload.expiry_mix}
        workload["will_delay_mix"] = {("none" if e is None else str(e)): w for e, w in self.workload.will_delay_mix}
        faults = asdict(self.faults)
        faults["mix"] = dict(self.faults.mix)
        faults["quiet_s"] = list(self.faults.quiet_s)
        faults["duration_s"] = list(self.faults.duration_s)
        faults["targets"] = {kind: list(selectors) for kind, selectors in self.faults.targets}
        faults["params"] = {kind: _plain(params) for kind, params in self.faults.params}
        faults["choices"] = {kind: {name: _plain(list(values)) for name, values in choice}
                             for kind, choice in self.faults.choices}
        subscribers = asdict(self.subscribers)
        subscribers["offline_s"] = list(self.subscribers.offline_s)
        subscribers["session_expiry_mix"] = {str(e): w for e, w in self.subscribers.session_expiry_mix}
        workload["publisher_offline_s"] = list(self.workload.publisher_offline_s)
        workload["home_nodes"] = dict(self.workload.home_nodes)
        if self.target.kind == "reference":
            target: dict[str, Any] = {"kind": "reference",
                                      "promises": reference_declaration(self.broker, self.topology)}
        else:
            target = asdict(self.target)
            for key in ("start", "stop", "kill", "mqtt_versions"):
                target[key] = list(target[key])
            target["files"] = dict(self.target.files)
            target["env"] = dict(self.target.env)
            target["credentials"] = self.target.credentials.to_dict()  # every password masked
            target["tls"] = self.target.tls.to_dict()  # enabled, server_name, verify (no key material)
            target["nodes"] = [node.to_dict() for node in self.target.nodes]  # as declared: reads back the same
            target["formation"] = self.target.formation.to_dict()
            for key in ("nodes", "formation"):
                if not target[key]:
                    del target[key]
            target["promises"] = self.target.declaration()
        if self.workload.pattern == "p2p":
            del workload["publishers"], workload["subscribers"]
        else:
            del workload["pairs"]
        from contracts.versions import SCENARIO_VERSION

        return {
            "schema_version": SCENARIO_VERSION,
            "scenario": asdict(self.scenario),
            "topology": _plain(self.topology),
            "target": target,
            "broker": self.broker_config() if self.target.kind == "reference" else _plain(self.broker),
            "workload": workload,
            "subscribers": subscribers,
            "faults": faults,
            "checks": {"clock_tolerance_ms": self.checks.clock_tolerance_ms,
                       "pipeline_slack_ms": self.checks.pipeline_slack_ms,
                       "allowed": list(self.checks.allowed),
                       "logs": {"preset": self.log_preset, "defaults": self.checks.logs.defaults,
                                "patterns": [p.to_dict() for p in self.checks.logs.patterns],
                                "effective": [p.to_dict() for p in self.log_patterns()]}},
        }


def _protocol_key(protocol: int) -> str:
    return {4: "mqtt311", 5: "mqtt5"}[protocol]


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# --------------------------------------------------------------------------------------------------
# Loading and validation
# --------------------------------------------------------------------------------------------------


class _Section(Section):
    """A scenario table: its errors are ScenarioErrors."""

    error = ScenarioError


SECTIONS = ("scenario", "topology", "target", "broker", "workload", "subscribers", "faults", "checks")


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file.  Raises ScenarioError naming the file, key, value and rule."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ScenarioError(f"{source}: cannot read the scenario file: {error.strerror or error}") from error
    return parse_scenario(text, source=source)


def parse_scenario(text: str, *, source: str = "<string>") -> Scenario:
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ScenarioError(f"{source}: not valid TOML: {error}") from error
    return scenario_from_mapping(document, source=source)


def scenario_from_mapping(document: Mapping[str, Any], *, source: str = "<mapping>") -> Scenario:
    """A scenario from its TOML tables, or from a scenario.json (``schema_version``: refused if unknown)."""
    if "schema_version" in document:
        from contracts.versions import SchemaVersionError, check_version

        try:
            check_version(dict(document), source, "scenario.json")
        except SchemaVersionError as error:
            raise ScenarioError(str(error)) from error
        document = {k: v for k, v in document.items() if k != "schema_version"}
    unknown = sorted(set(document) - set(SECTIONS))
    if unknown:
        raise ScenarioError(f"{source}: unknown section [{unknown[0]}]; allowed sections: {', '.join(SECTIONS)}")
    if "scenario" not in document:
        raise ScenarioError(f"{source}: the [scenario] section is required")

    info = _read_info(_Section(source, "scenario", document.get("scenario")))
    broker_table = document.get("broker") if isinstance(document.get("broker"), dict) else {}
    topology_table = document.get("topology") if isinstance(document.get("topology"), dict) else {}
    target = _read_target(_Section(source, "target", document.get("target")), broker_table, topology_table)
    if target.kind == "external":
        # An external target may choose its topology provider; everything else in [topology] and [broker]
        # configures the reference broker's own stack.
        given = document.get("topology") if isinstance(document.get("topology"), dict) else {}
        for section, extra in (("topology", sorted(set(given) - {"provider"})), ("broker", document.get("broker"))):
            if extra:
                raise ScenarioError(
                    f"{source}: [{section}] configures the local reference-broker topology only (an external "
                    "target takes [topology] provider alone); remove it for an external target (configure "
                    "that broker through [target] config_text)")
        topology: Mapping[str, Any] = {}
        if given.get("provider", "local") != "local":
            try:
                topology = {"provider": topology_model().normalise(
                    {"provider": given["provider"]}, f"{source} [topology]")["provider"]}
            except ValueError as error:
                raise ScenarioError(str(error)) from error
    else:
        topology = _read_topology(source, document.get("topology"))
    broker = _read_broker(source, document.get("broker"))
    workload = _read_workload(_Section(source, "workload", document.get("workload")))
    subscribers = _read_subscribers(_Section(source, "subscribers", document.get("subscribers")))
    if subscribers.session_expiry_mix and dict(workload.protocol_mix).get(5, 0) <= 0:
        raise ScenarioError(f"{source}: [subscribers] session_expiry_mix = "
                            f"{ {str(e): w for e, w in subscribers.session_expiry_mix} !r}: a session expiry "
                            "interval needs MQTT 5 subscribers; give [workload] protocol_mix an mqtt5 weight > 0")
    faults = _read_faults(_Section(source, "faults", document.get("faults")), target)
    checks = _read_checks(_Section(source, "checks", document.get("checks")))
    _refuse_log_losing_kills(source, topology, faults)
    if target.kind == "external":
        _refuse_inapplicable_to_external(source, target, faults, workload)
    refuse_unsupported_faults(source, str(topology.get("provider", "local")), faults)
    refuse_unsupported_on_containers(source, str(topology.get("provider", "local")), target)
    scenario = Scenario(source=source, scenario=info, topology=topology, target=target, broker=broker,
                        workload=workload, subscribers=subscribers, faults=faults, checks=checks)
    if target.kind == "reference" and workload.shared_groups:
        _refuse_device_shared_members(source, broker, workload)
    nodes = scenario.broker_nodes()
    for client_id, node in workload.home_nodes:
        if node not in nodes:
            raise ScenarioError(f"{source}: [workload] home_nodes.{client_id} = {node!r}: no broker node of that "
                                f"name; the broker nodes: {', '.join(nodes)}")
    return scenario


def _refuse_device_shared_members(source: str, broker: Mapping[str, Any], workload: WorkloadSpec) -> None:
    """The reference broker, like TBMQ, takes a shared subscription from a persistent APPLICATION client only (a
    DEVICE gets SUBACK 0x9E, docs/reference-broker.md "Shared subscriptions"): every member must be one."""
    rules = application_rules(broker, f"{source} [broker]")
    devices = [member for member, _ in workload.shared_members_of() if not is_application(rules, member)]
    if devices:
        raise ScenarioError(
            f"{source}: [workload] shared_groups = {workload.shared_groups}: the reference broker takes a shared "
            f"subscription from APPLICATION clients only, and {devices[0]!r} is a DEVICE under [broker] "
            "application_clients; add a rule for the members, e.g. application_clients = "
            "[{ client_id = \"test_share_client_*\" }]")


def _read_info(s: _Section) -> ScenarioInfo:
    name = s.string("name", required=True, non_empty=True)
    if not all(c.isalnum() or c in "-_." for c in name):
        raise s.fail("name", name, "may only contain letters, digits, '-', '_' and '.' (it names run directories)")
    info = ScenarioInfo(
        name=name,
        description=s.string("description", ""),
        tier=s.string("tier", "smoke", choices=TIERS),
        duration_s=s.number("duration_s", required=True, above=0.0, maximum=86400.0),
        drain_quiet_s=s.number("drain_quiet_s", 3.0, above=0.0, maximum=3600.0),
        drain_timeout_s=s.number("drain_timeout_s", 60.0, above=0.0, maximum=86400.0),
        resource_sample_s=_resource_sample_s(s),
    )
    if info.drain_timeout_s < info.drain_quiet_s:
        raise s.fail("drain_timeout_s", info.drain_timeout_s,
                     f"must be >= drain_quiet_s ({info.drain_quiet_s})")
    s.finish()
    return info


def _resource_sample_s(s: _Section) -> float:
    value = s.number("resource_sample_s", DEFAULT_RESOURCE_SAMPLE_S, minimum=0.0, maximum=MAX_RESOURCE_SAMPLE_S)
    if 0.0 < value < 0.1:
        raise s.fail("resource_sample_s", value, "must be 0 (no resource samples) or at least 0.1 seconds "
                     f"(default {DEFAULT_RESOURCE_SAMPLE_S}: harness/resources.py, docs/history.md)")
    return value


def _read_topology(source: str, table: Any) -> Mapping[str, Any]:
    """Validated by the topology's own TopologyConfig (harness/topology_config.py, registered); the scenario keeps its
    normalised mapping."""
    if table is not None and not isinstance(table, dict):
        raise ScenarioError(f"{source}: [topology] must be a table, got {table!r}")
    mapping = dict(table or {})
    mapping.setdefault("broker_nodes", 1)  # the reference target needs at least one broker node
    if isinstance(mapping["broker_nodes"], int) and mapping["broker_nodes"] < 1:
        raise ScenarioError(f"{source}: [topology] broker_nodes = {mapping['broker_nodes']!r}: the reference "
                            "target needs at least 1 broker node")
    try:
        return topology_model().normalise(mapping, source)
    except ValueError as error:
        raise ScenarioError(str(error)) from error


def reference_declaration(broker: Mapping[str, Any], topology: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the reference broker promises, from its [broker] configuration (one source: the reference broker's
    BrokerConfig, whose normalised table the registered validator returns) and its store's fsync setting
    ([topology] redis_appendfsync): a session store that fsyncs every write before answering ("always") keeps
    what it acknowledged through a power loss ("power"); any other setting only through a kill ("kill")."""
    config = _registered(_BROKER, "broker validator (harness/model.py)")(dict(broker), "[broker]")
    fsync = (topology or {}).get("redis_appendfsync")  # unset: the topology default, not "always"
    return {"mqtt_versions": list(MQTT_VERSIONS), "queue_limit": config["persisted_messages_limit"],
            "queue_policy": "drop_oldest", "persistence": "power" if fsync == "always" else "kill",
            "message_ttl_s": config["persisted_message_ttl_s"], "features": REFERENCE_FEATURES}


# What the reference broker offers beyond the sessions, as its CONNACK declares it (MQTT 5: Retain Available,
# Shared Subscription Available; reference_broker/connection.py) and docs/reference-broker.md describes: Wills
# (with Will Delay), retained messages kept in Redis, shared subscriptions for persistent APPLICATION clients.
REFERENCE_FEATURES = {"will": True, "retained": True, "shared_subscriptions": "application clients"}


def _read_target(s: _Section, broker: Mapping[str, Any], topology: Mapping[str, Any]) -> TargetSpec:
    kind = s.string("kind", "reference", choices=TARGET_KINDS)
    # "promises" is derived (scenario.json writes it); read back, it must say what the other keys say.
    derived = s.raw_table("promises")
    if kind == "reference":
        if "credentials" in s.table:
            raise s.fail("credentials", "...", "the reference broker accepts anonymous clients and ignores "
                         "credentials; [target.credentials] applies to an external target (kind = \"external\")")
        if "tls" in s.table:
            raise s.fail("tls", "...", "the reference broker serves plain MQTT; [target.tls] applies to an external "
                         "target (kind = \"external\") whose listener speaks TLS")
        s.finish()  # nothing else applies to the reference broker; its settings live in [broker]
        declared = reference_declaration(broker, topology)
        if "features" not in derived:  # a scenario.json written before the declaration named them
            declared.pop("features")
        if derived and _plain(derived) != declared:
            raise s.fail("promises", derived, "is derived from [broker]; change the [broker] keys instead")
        return TargetSpec(kind="reference")
    host = read_host(s)
    name = read_name(s, "broker", what="the log file")
    files = read_files(s, written_to="the run directory")
    env = read_env(s)
    versions = s.strings("mqtt_versions", TargetSpec.mqtt_versions)
    for version in versions:
        if version not in MQTT_VERSIONS:
            raise s.fail("mqtt_versions", list(versions), f"unknown MQTT version {version!r}; allowed: "
                         f"{', '.join(repr(v) for v in MQTT_VERSIONS)}")
    if not versions:
        raise s.fail("mqtt_versions", [], "name at least one MQTT version the target speaks")
    policy = s.string("queue_policy", "none", choices=QUEUE_POLICIES)
    limit = s.integer("queue_limit", 0, minimum=0, maximum=10_000_000)
    if (policy == "none") != (limit == 0):
        raise s.fail("queue_limit" if limit else "queue_policy", limit if limit else policy,
                     "queue_limit and queue_policy go together: a limit > 0 needs a policy (drop_oldest, "
                     "drop_newest, reject), and policy \"none\" takes no limit")
    spec = TargetSpec(
        kind=kind,
        name=name,
        host=host,
        port=s.integer("port", 0, minimum=0, maximum=65535),
        start=s.strings("start"),
        stop=s.strings("stop"),
        kill=s.strings("kill"),
        config_file=s.string("config_file", ""),
        config_text=s.string("config_text", ""),
        files=files,
        env=env,
        data_owner=s.string("data_owner", ""),
        ready_timeout_s=s.number("ready_timeout_s", 10.0, above=0.0, maximum=600.0),
        ready=s.string("ready", "mqtt", choices=READY_CHECKS),
        mqtt_versions=tuple(sorted(set(versions), key=list(MQTT_VERSIONS).index)),
        queue_limit=limit,
        queue_policy=policy,
        persistence=s.string("persistence", "kill", choices=PERSISTENCE_PROMISES),
        message_ttl_s=s.integer("message_ttl_s", 0, minimum=0, maximum=2**31 - 1),
        credentials=read_credentials(s, _credentials_table(s), os.environ),
        tls=read_tls(s, s._get("tls", {}, False)),
        nodes=read_nodes(s, s._get("nodes", None, False)),
    )
    spec = replace(spec, formation=read_formation(s, s._get("formation", None, False), spec.nodes))
    if spec.nodes and (spec.host or spec.port):
        raise s.fail("host" if spec.host else "port", spec.host or spec.port, "a target with [[target.nodes]] "
                     "gives each node its own host and port (in its [[target.nodes]] table), not the target")
    for node in spec.node_specs():
        if not node.start:
            where = f"[[target.nodes]] {node.name!r} has no start and the target" if spec.nodes else "an external target"
            raise s.fail("start", [], f"{where} needs the argv that starts it, e.g. "
                         "[\"mosquitto\", \"-c\", \"{run_dir}/mosquitto.conf\"]")
    if bool(spec.config_file) != bool(spec.config_text):
        raise s.fail("config_file", spec.config_file, "config_file and config_text go together")
    if spec.config_file and ("/" in spec.config_file or spec.config_file.startswith(".")):
        raise s.fail("config_file", spec.config_file, "must be a plain file name (written into the run directory)")
    if spec.config_file and spec.config_file in files:
        raise s.fail(f"files.{spec.config_file}", "...", "is also config_file; give it once")
    if derived and _plain(derived) != spec.declaration():
        raise s.fail("promises", derived, "is derived from mqtt_versions, queue_limit, queue_policy, persistence "
                     "and message_ttl_s; set those keys instead")
    s.finish()
    return spec


def _credentials_table(s: _Section) -> dict[str, Any]:
    table = s._get("credentials", {}, False)
    if not isinstance(table, dict):  # its value is not shown: it may hold a password
        raise s.fail("credentials", "...", "must be a table: [target.credentials] with username / username_env and "
                     "password / password_env (docs/scenarios.md, \"Client credentials\")")
    return table


def _refuse_inapplicable_to_external(source: str, target: TargetSpec, faults: FaultSpec,
                                     workload: WorkloadSpec) -> None:
    """An external target is one broker process and its clients: no Redis, no Kafka, no storage.  A fault
    that needs those, or a protocol the target does not speak, is refused here, before anything starts
    (which faults can apply is the fault catalog's knowledge: FaultCatalog.external_refusal)."""
    where = f"{source}: [target] {target.name!r} (external)"
    missing = [level for level, weight in workload.protocol_mix if weight > 0 and level not in target.protocol_levels]
    if missing:
        names = {4: "3.1.1", 5: "5"}
        raise ScenarioError(
            f"{source}: [workload] protocol_mix sends MQTT {names[missing[0]]} but {where} declares "
            f"mqtt_versions = {list(target.mqtt_versions)}: it does not speak MQTT {names[missing[0]]}; give that "
            "protocol weight 0 or declare the version")
    catalog = fault_catalog()
    for kind, _weight in faults.mix:
        variants = [faults.params_of(kind)] + [{name: value} for name, values in faults.choices_of(kind)
                                               for value in values]
        selectors = faults.targets_of(kind)
        own = harness_data_dirs(target.node_specs(), target.config_text if target.config_file else "")
        why = catalog.external_refusal(kind, selectors, variants,
                                       tuple((node.name, node.role, own[node.name]) for node in target.node_specs()))
        if why:
            key, _, reason = why.partition(": ")
            raise ScenarioError(f"{source}: [faults] {key}: cannot apply to {where}: {reason}")


def _read_broker(source: str, table: Any) -> Mapping[str, Any]:
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise ScenarioError(f"{source}: [broker] must be a table, got {table!r}")
    validate = _registered(_BROKER, "broker validator (harness/model.py)")
    try:
        validate(table, f"{source} [broker]")  # the reference broker validates its own configuration
    except (ValueError, TypeError) as error:
        raise ScenarioError(str(error) if source in str(error) else f"{source}: [broker] {error}") from error
    return dict(table)


def _read_workload(s: _Section) -> WorkloadSpec:
    d = WorkloadSpec()
    pattern = s.string("pattern", d.pattern, choices=PATTERNS)
    if pattern == "p2p":
        pairs = s.integer("pairs", d.pairs, minimum=1, maximum=5000)
        publishers = subscribers = pairs
    else:
        pairs = 0
        publishers = s.integer("publishers", d.publishers, minimum=1, maximum=5000)
        subscribers = s.integer("subscribers", d.subscribers, minimum=1, maximum=5000)
    rate = s.number("rate_per_publisher", d.rate_per_publisher, above=0.0, maximum=1000.0)
    qos = s.weights("qos_mix", {"qos1": 1.0}, tuple(QOS_KEYS), "QoS")
    nonzero_total(s, "qos_mix", qos)
    protocols = s.weights("protocol_mix", {"mqtt311": 1.0}, tuple(PROTOCOL_KEYS), "protocol")
    nonzero_total(s, "protocol_mix", protocols)
    expiry_raw = s.weights("expiry_mix", {"none": 1.0}, None, "expiry")
    nonzero_total(s, "expiry_mix", expiry_raw)
    expiry: list[tuple[int | None, float]] = []
    for key, weight in expiry_raw.items():
        if key == "none":
            expiry.append((None, weight))
        elif key.isdigit() and 0 <= int(key) <= 2**32 - 1:
            # 0 is a valid Four Byte Integer on the wire (MQTT 5 §3.3.2.3.3): a lifetime of 0 s, so the
            # message has expired by the time the broker holds it (docs/scenarios.md, "Message expiry 0")
            expiry.append((int(key), weight))
        else:
            raise s.fail(f"expiry_mix.{key}", weight,
                         "keys must be \"none\" or a whole number of seconds 0..4294967295, e.g. \"5\"")
    if any(e is not None and w > 0 for e, w in expiry) and protocols.get("mqtt5", 0) <= 0:
        raise s.fail("expiry_mix", expiry_raw, "message expiry needs MQTT 5 publishers: give protocol_mix "
                     "an mqtt5 weight > 0, or use only \"none\"")
    delay_raw = s.weights("will_delay_mix", {"none": 1.0}, None, "Will Delay")
    nonzero_total(s, "will_delay_mix", delay_raw)
    will_delays: list[tuple[int | None, float]] = []
    for key, weight in delay_raw.items():
        if key == "none":
            will_delays.append((None, weight))
        elif key.isdigit() and 0 <= int(key) <= 2**32 - 1:
            will_delays.append((int(key), weight))
        else:
            raise s.fail(f"will_delay_mix.{key}", weight,
                         "keys must be \"none\" or a whole number of seconds 0..4294967295, e.g. \"2\"")
    spec = WorkloadSpec(
        pattern=pattern, pairs=pairs, publishers=publishers, subscribers=subscribers,
        rate_per_publisher=rate,
        qos_mix=tuple(sorted((QOS_KEYS[k], w) for k, w in qos.items())),
        payload_size=s.integer("payload_size", d.payload_size, minimum=MIN_PAYLOAD_SIZE, maximum=256 * 1024),
        protocol_mix=tuple(sorted((PROTOCOL_KEYS[k], w) for k, w in protocols.items())),
        expiry_mix=tuple(sorted(expiry, key=lambda ew: -1 if ew[0] is None else ew[0])),
        preset_last_packet_id=s.integer("preset_last_packet_id", 0, minimum=0, maximum=MAX_PACKET_ID),
        preset_each_offline=s.boolean("preset_each_offline", d.preset_each_offline),
        subscription_qos=s.integer("subscription_qos", d.subscription_qos, minimum=0, maximum=2),
        publisher_disconnects_per_minute=s.number("publisher_disconnects_per_minute",
                                                  d.publisher_disconnects_per_minute, minimum=0.0, maximum=600.0),
        publisher_abrupt_fraction=s.fraction("publisher_abrupt_fraction", d.publisher_abrupt_fraction),
        publisher_offline_s=s.number_range("publisher_offline_s", d.publisher_offline_s),
        home_node=s.string("home_node", d.home_node, choices=HOME_NODE_POLICIES),
        home_nodes=tuple(sorted(s.raw_table("home_nodes").items())),
        mqtt5_properties=s.boolean("mqtt5_properties", d.mqtt5_properties),
        subscription_identifiers=s.boolean("subscription_identifiers", d.subscription_identifiers),
        retain_as_published=s.boolean("retain_as_published", d.retain_as_published),
        receive_maximum=_optional_integer(s, "receive_maximum", 1, 65535),
        maximum_packet_size=_optional_integer(s, "maximum_packet_size", 1, 268_435_455),
        wills=s.fraction("wills", d.wills),
        will_delay_mix=tuple(sorted(will_delays, key=lambda dw: -1 if dw[0] is None else dw[0])),
        retained=s.fraction("retained", d.retained),
        retained_topics=s.integer("retained_topics", d.retained_topics, minimum=1, maximum=100),
        late_subscribers=s.integer("late_subscribers", d.late_subscribers, minimum=1, maximum=100),
        shared_groups=s.integer("shared_groups", d.shared_groups, minimum=0, maximum=100),
        shared_members=s.integer("shared_members", d.shared_members, minimum=1, maximum=100),
        fan_in_subscribers=s.integer("fan_in_subscribers", d.fan_in_subscribers, minimum=0, maximum=5000),
    )
    if spec.fan_in_subscribers and pattern != "p2p":
        raise s.fail("fan_in_subscribers", spec.fan_in_subscribers, "adds fan-in subscribers to a p2p workload; "
                     "under pattern = \"fan-in\" every subscriber already is one (give subscribers instead)")
    mqtt5_only = [(key, value) for key, value in (
        ("mqtt5_properties", spec.mqtt5_properties), ("subscription_identifiers", spec.subscription_identifiers),
        ("retain_as_published", spec.retain_as_published), ("receive_maximum", spec.receive_maximum),
        ("maximum_packet_size", spec.maximum_packet_size)) if value not in (None, False)]
    if mqtt5_only and protocols.get("mqtt5", 0) <= 0:
        key, value = mqtt5_only[0]
        raise s.fail(key, value, "an MQTT 5 option: only MQTT 5 clients send it; give protocol_mix an mqtt5 weight "
                     "> 0")
    publishers, subscribers = spec.client_ids()
    clients = (publishers + subscribers + tuple(c for c, _ in spec.fan_in_subscribers_of())
               + tuple(member for member, _ in spec.shared_members_of()))
    for client_id, node in spec.home_nodes:
        if not isinstance(node, str) or not node:
            raise s.fail(f"home_nodes.{client_id}", node, "must be the name of a broker node (a string)")
        if client_id not in clients:
            shown = ", ".join(clients[:6]) + (", ..." if len(clients) > 6 else "")
            raise s.fail(f"home_nodes.{client_id}", node, f"no client {client_id!r} in this workload; its "
                         f"clients: {shown}")
    if any(e is not None and w > 0 for e, w in spec.will_delay_mix) and protocols.get("mqtt5", 0) <= 0:
        raise s.fail("will_delay_mix", delay_raw, "a Will Delay Interval needs MQTT 5 subscribers: give protocol_mix an "
                     "mqtt5 weight > 0, or use only \"none\"")
    if delay_raw != {"none": 1.0} and not spec.wills:
        raise s.fail("will_delay_mix", delay_raw, "needs wills > 0 (the share of subscribers that send a Will)")
    if spec.preset_each_offline and not spec.preset_last_packet_id:
        raise s.fail("preset_each_offline", True, "needs preset_last_packet_id > 0 (the value each offline "
                     "window's session is preset to), e.g. preset_last_packet_id = 65500")
    s.finish()
    return spec


def _optional_integer(s: _Section, key: str, minimum: int, maximum: int) -> int | None:
    """An integer key whose absence means "not sent" (None; scenario.json writes it as null)."""
    s.allow(key)
    if s.table.get(key) is None:
        return None
    return s.integer(key, minimum, minimum=minimum, maximum=maximum)


def _read_subscribers(s: _Section) -> SubscriberSpec:
    d = SubscriberSpec()
    spec = SubscriberSpec(
        disconnects_per_minute=s.number("disconnects_per_minute", d.disconnects_per_minute, minimum=0.0,
                                        maximum=600.0),
        abrupt_fraction=s.fraction("abrupt_fraction", d.abrupt_fraction),
        clean_start_fraction=s.fraction("clean_start_fraction", d.clean_start_fraction),
        session_expiry_s=s.integer("session_expiry_s", d.session_expiry_s, minimum=1, maximum=2**32 - 1),
        offline_s=s.number_range("offline_s", d.offline_s),
        reconnect_node=s.string("reconnect_node", d.reconnect_node, choices=RECONNECT_NODES),
        withhold_acks_s=s.number("withhold_acks_s", d.withhold_acks_s, minimum=0.0, maximum=60.0),
        session_expiry_mix=_session_expiry_mix(s),
    )
    s.finish()
    return spec


def _session_expiry_mix(s: _Section) -> tuple[tuple[int, float], ...]:
    raw = s.weights("session_expiry_mix", {}, None, "session expiry")
    if not raw:
        return ()
    nonzero_total(s, "session_expiry_mix", raw)
    mix: list[tuple[int, float]] = []
    for key, weight in raw.items():
        if not (key.isdigit() and 0 <= int(key) <= 2**32 - 1):
            raise s.fail(f"session_expiry_mix.{key}", weight,
                         "keys must be a whole number of seconds 0..4294967295, e.g. \"0\", \"2\" or \"3600\"")
        mix.append((int(key), weight))
    return tuple(sorted(mix))


PLACEHOLDERS = ("{subscriber}",)
PLACEHOLDER_EXAMPLE = "test_sub_client_0_0"  # stands in for {subscriber} when validating at load time


def fill_placeholders(value: Any, subscriber: str) -> Any:
    """``{subscriber}`` in a selector or (nested) string parameter -> the drawn subscriber's client id."""
    if isinstance(value, str):
        return value.replace("{subscriber}", subscriber)
    if isinstance(value, list | tuple):
        return [fill_placeholders(v, subscriber) for v in value]
    if isinstance(value, Mapping):
        return {k: fill_placeholders(v, subscriber) for k, v in value.items()}
    return value


def full_fault_params(kind: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Every parameter of the kind with defaults filled (plan.json holds the full parameters)."""
    return fault_catalog().full_params(kind, params)


def uses_placeholder(value: Any) -> bool:
    return fill_placeholders(value, "\0") != value


def _read_faults(s: _Section, target: TargetSpec | None = None) -> FaultSpec:
    d = FaultSpec()
    external = target is not None and target.kind == "external"
    mix = s.weights("mix", {}, known_fault_kinds(), "fault kind")
    spec = FaultSpec(
        mix=tuple(sorted(mix.items())),
        quiet_s=s.number_range("quiet_s", d.quiet_s),
        duration_s=s.number_range("duration_s", d.duration_s),
        tail_s=s.number("tail_s", d.tail_s, minimum=0.0),
        max_faults=s.integer("max_faults", d.max_faults, minimum=0, maximum=100000),
    )
    if mix and spec.quiet_s[1] <= 0:
        raise s.fail("quiet_s", list(spec.quiet_s), "needs a high end > 0 (a schedule needs quiet time)")
    targets_raw = s.raw_table("targets")
    params_raw = s.raw_table("params")
    choices_raw = s.raw_table("choices")
    s.finish()
    for key, table in (("targets", targets_raw), ("params", params_raw), ("choices", choices_raw)):
        for kind in table:
            if kind not in mix:
                raise s.fail(f"{key}.{kind}", table[kind], f"{kind!r} is not in the mix; kinds in the mix: "
                             f"{', '.join(sorted(mix)) or '(none)'}")
    targets: list[tuple[str, tuple[str, ...]]] = []
    params: list[tuple[str, Mapping[str, Any]]] = []
    choices: list[tuple[str, tuple[tuple[str, tuple[Any, ...]], ...]]] = []
    for kind in sorted(mix):
        default_targets = fault_catalog().default_targets
        defaults = default_targets.get(kind, ())
        if external and kind in default_targets and (kind.startswith("process_") or kind == "net_isolate"):
            # the one process a black-box target has, or any broker node of a cluster
            defaults = (f"node:{target.name}",) if not target.clustered else ("broker-random",)
        selectors = targets_raw.get(kind, defaults)
        if isinstance(selectors, str):
            selectors = [selectors]
        if not isinstance(selectors, list | tuple) or not all(isinstance(t, str) and t for t in selectors):
            raise s.fail(f"targets.{kind}", selectors, "must be a list of target selectors (strings)")
        fixed = params_raw.get(kind, {})
        if not isinstance(fixed, dict):
            raise s.fail(f"params.{kind}", fixed, "must be a table of parameter = value")
        drawn = choices_raw.get(kind, {})
        if not isinstance(drawn, dict) or not all(isinstance(v, list) and v for v in drawn.values()):
            raise s.fail(f"choices.{kind}", drawn, "must be a table of parameter = [values to draw from]")
        overlap = sorted(set(fixed) & set(drawn))
        if overlap:
            raise s.fail(f"choices.{kind}.{overlap[0]}", drawn[overlap[0]],
                         f"is also fixed in params.{kind}; give it in one of them")
        _validate_fault_kind(s, kind, tuple(selectors), fixed, drawn)
        if selectors:
            targets.append((kind, tuple(selectors)))
        if fixed:
            params.append((kind, dict(fixed)))
        if drawn:
            choices.append((kind, tuple((name, tuple(values)) for name, values in sorted(drawn.items()))))
    return FaultSpec(mix=spec.mix, quiet_s=spec.quiet_s, duration_s=spec.duration_s, tail_s=spec.tail_s,
                     max_faults=spec.max_faults, targets=tuple(targets), params=tuple(params),
                     choices=tuple(choices))


def _validate_fault_kind(s: _Section, kind: str, selectors: tuple[str, ...], fixed: dict[str, Any],
                         drawn: dict[str, list[Any]]) -> None:
    """Every target and every drawn parameter value must make a valid fault (faults/catalog.py decides)."""
    catalog = fault_catalog()
    target_type = catalog.target_type(kind)
    if target_type in ("node", "client") and not selectors:
        raise s.fail(f"targets.{kind}", [], f"fault kind {kind!r} needs a target; give a list of selectors")
    if target_type == "none" and selectors:
        raise s.fail(f"targets.{kind}", list(selectors), f"fault kind {kind!r} takes no target")
    variants = [dict(fixed)] + [{**fixed, name: value} for name, values in drawn.items() for value in values]
    for target in selectors or (None,):
        for params in variants:
            spec = {"id": "check", "kind": kind,
                    "target": fill_placeholders(target, PLACEHOLDER_EXAMPLE) if target else None,
                    "params": fill_placeholders(params, PLACEHOLDER_EXAMPLE)}
            try:
                catalog.validate(spec)
            except ValueError as error:
                where = f"targets.{kind}" if target is not None else f"params.{kind}"
                raise s.fail(where, target if target is not None else params, str(error)) from None


def refuse_unsupported_faults(source: str, provider: str, faults: FaultSpec) -> None:
    """A fault kind the topology provider cannot play is refused at load (faults/catalog.py PROVIDER_GAPS)."""
    catalog = fault_catalog()
    problems = catalog.provider_gaps(provider, [kind for kind, _weight in faults.mix])
    for kind, _weight in faults.mix:  # a kind supported, but not with every parameter (process_kill at_commit)
        fixed = faults.params_of(kind)
        variants = [fixed] + [{**fixed, name: value} for name, values in faults.choices_of(kind) for value in values]
        problems += list(dict.fromkeys(why for params in variants
                                       if (why := catalog.provider_param_gaps(provider, kind, params))))
    if problems:
        raise ScenarioError(f"{source} [faults]: " + "; ".join(problems))


def with_provider(scenario: Scenario, provider: str) -> Scenario:
    """The scenario run on another topology provider (``--provider``): [topology] provider replaced,
    validated again (a fault the provider lacks is refused here, before anything starts)."""
    try:  # the topology model says which providers exist
        topology_model().normalise({"provider": provider}, "--provider")
    except ValueError as error:
        raise ScenarioError(str(error)) from error
    if scenario.target.kind == "reference":
        topology = dict(_read_topology(scenario.source, {**scenario.topology, "provider": provider}))
    else:
        topology = {"provider": provider} if provider != "local" else {}
    refuse_unsupported_faults(scenario.source, provider, scenario.faults)
    refuse_unsupported_on_containers(scenario.source, provider, scenario.target)
    return replace(scenario, topology=topology)


def refuse_unsupported_on_containers(source: str, provider: str, target: TargetSpec) -> None:
    """The containers provider runs an external target as one container without the run's TLS files; a
    cluster or a TLS listener runs as host processes (the local provider)."""
    if provider == "containers" and target.tls.enabled:
        raise ScenarioError(f"{source}: [topology] provider = \"containers\": [target.tls] needs the run's own CA "
                            "and server certificate, which the containers provider does not make; run a TLS target "
                            "with the local provider")
    if provider == "containers" and target.clustered:
        raise ScenarioError(f"{source}: [topology] provider = \"containers\": [[target.nodes]] declares "
                            f"{len(target.nodes)} nodes, and the containers provider runs an external target as "
                            "one container; run a clustered target with the local provider")


def _refuse_log_losing_kills(source: str, topology: Mapping[str, Any], faults: FaultSpec) -> None:
    """A kill of the Kafka storage server on moto (or of Tansu on its memory engine) loses every record the
    Kafka stand-in acknowledged: the run would blame the broker under test for the stand-in's loss, so the
    scenario is refused here, before a run directory exists (faults/process.py refuses it again at run time
    for plans that bypass this file)."""
    if not topology:
        return
    catalog = fault_catalog()
    for kind in catalog.log_losing_kinds:
        for selector in faults.targets_of(kind):
            role = catalog.kafka_role_of(fill_placeholders(selector, PLACEHOLDER_EXAMPLE))
            why = topology_model().kill_loses_log(topology, role) if role else ""
            if why:
                raise ScenarioError(f"{source}: [faults] targets.{kind} = {selector!r}: {why}.")


def _read_checks(s: _Section) -> CheckSpec:
    tolerance = s.integer("clock_tolerance_ms", CheckSpec().clock_tolerance_ms, minimum=0, maximum=600000)
    slack = s.integer("pipeline_slack_ms", CheckSpec().pipeline_slack_ms, minimum=0, maximum=600000)
    allowed = s.strings("allowed")
    for invariant in allowed:
        if invariant not in INVARIANT_IDS:
            raise s.fail("allowed", invariant, f"unknown invariant id; known ids: {', '.join(IDS)}")
    logs = _read_logs(_Section(s.source, "checks.logs", s.raw_table("logs")))
    s.finish()
    return CheckSpec(clock_tolerance_ms=tolerance, pipeline_slack_ms=slack, allowed=tuple(sorted(set(allowed))),
                     logs=logs)


def _read_logs(s: _Section) -> LogSpec:
    """[checks.logs]: every pattern compiled now, so a bad regex stops the run before anything starts."""
    preset = s.string("preset", "", choices=("",) + LOG_PRESETS)
    defaults = s._get("defaults", True, False)
    if not isinstance(defaults, bool):
        raise s.fail("defaults", defaults, "must be true or false")
    raw = s._get("patterns", [], False)
    if not isinstance(raw, list):
        raise s.fail("patterns", raw, "must be an array of tables ([[checks.logs.patterns]])")
    patterns = []
    for index, item in enumerate(raw):
        if isinstance(item, dict) and item.get("source", "scenario") != "scenario":
            raise s.fail(f"patterns[{index}].source", item["source"], "is set by Ordeal, not by a scenario")
        try:
            patterns.append(log_pattern_from_mapping(item, f"[checks.logs] patterns[{index}]"))
        except ValueError as error:
            raise ScenarioError(f"{s.source}: {error}") from None
    s._get("effective", None, False)  # scenario.json's derived list (to_dict): recomputed, never read
    names = [p.name for p in patterns]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise s.fail("patterns", twice, "each pattern name may appear once")
    s.finish()
    return LogSpec(preset=preset, defaults=defaults, patterns=tuple(patterns))


def find_scenario(name_or_path: str, scenarios_dir: Path | None = None) -> Path:
    """``p2p-smoke`` or ``scenarios/p2p-smoke.toml`` -> the file's path (ScenarioError if missing)."""
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml" or candidate.exists():
        if not candidate.is_file():
            raise ScenarioError(f"{name_or_path}: no such scenario file")
        return candidate
    directory = scenarios_dir or default_scenarios_dir()
    path = directory / f"{name_or_path}.toml"
    if not path.is_file():
        known = ", ".join(p.stem for p in sorted(directory.glob("*.toml"))) or "(none)"
        raise ScenarioError(f"{name_or_path}: no such scenario in {directory}; known: {known}")
    return path


def default_scenarios_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "scenarios"
