"""The plan: everything a run will do, as pure data (no I/O), and its JSON codec.

Same scenario + seed → byte-identical ``plan.json`` (properties/generate.py makes the plan; this module
only holds and encodes it).  Offsets are seconds from the start of the workload phase.  Broker nodes are
referred to by index (0 .. broker_nodes-1); the target maps an index to an address.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, ClassVar

from contracts.errors import UsageError

PLAN_VERSION = 1

PUBLISHER = "publisher"
SUBSCRIBER = "subscriber"
CONNECT = "connect"
DISCONNECT = "disconnect"


class PlanError(UsageError):
    """A plan.json that cannot be read back."""


@dataclass(frozen=True)
class Subscription:
    topic_filter: str
    qos: int
    # MQTT 5 SUBSCRIBE options ([workload] subscription_identifiers / retain_as_published)
    sub_id: int | None = None  # the SUBSCRIBE's Subscription Identifier (None: none sent)
    retain_as_published: bool = False  # the subscription's Retain As Published option

    OMITTED_AT_DEFAULT: ClassVar[tuple[str, ...]] = ("sub_id", "retain_as_published")


@dataclass(frozen=True)
class WillPlan:
    """The Will every connection of a client sends in its CONNECT ([workload] wills): a QoS 1 message on the
    client's own will topic (contracts/history_schema.will_topic), no Will Retain, and on MQTT 5 an optional Will
    Delay Interval (None: none sent, i.e. 0).  The payload names the connection (harness/clients.py)."""

    topic: str
    qos: int = 1
    delay_s: int | None = None


@dataclass(frozen=True)
class ClientPlan:
    client_id: str
    role: str  # publisher | subscriber
    protocol: int  # 4 = MQTT 3.1.1, 5 = MQTT 5.0
    node: int  # broker node index of the first connection
    subscriptions: tuple[Subscription, ...] = ()
    persistent: bool = False  # keeps its session across connections (clean_session=0 / expiry > 0)
    session_expiry_s: int | None = None  # MQTT 5 only
    preset_last_packet_id: int = 0  # 0 = none; a white-box target presets the session's last packet id
    publisher_index: int | None = None  # the payload identity's publisher field (contracts/payload.py)
    # MQTT 5 CONNECT properties every connection of this client sends (None: not sent -- 65535 / no limit)
    receive_maximum: int | None = None
    maximum_packet_size: int | None = None
    will: WillPlan | None = None  # the Will of each of its CONNECTs (None: none)

    OMITTED_AT_DEFAULT: ClassVar[tuple[str, ...]] = ("receive_maximum", "maximum_packet_size", "will")


@dataclass(frozen=True)
class PublishPlan:
    offset_s: float
    publisher: str
    seq: int  # per publisher, from 1, in offset order
    topic: str
    qos: int
    size: int
    expiry_s: int | None = None  # MQTT 5 message expiry interval; None = none
    # MQTT 5: send the workload's forwarded properties (contracts/mqtt_properties.workload_properties)
    properties: bool = False
    retain: bool = False  # RETAIN 1 ([workload] retained): the broker keeps it as the topic's retained message

    OMITTED_AT_DEFAULT: ClassVar[tuple[str, ...]] = ("properties", "retain")


@dataclass(frozen=True)
class SubscriberAction:
    offset_s: float
    client_id: str
    action: str  # connect | disconnect
    abrupt: bool = False  # disconnect: close the socket without DISCONNECT
    clean_start: bool = False  # connect
    session_expiry_s: int | None = None  # connect, MQTT 5
    node: int = 0  # connect: broker node index
    withhold_acks_s: float = 0.0  # abrupt disconnect: send no PUBACK for this long before the drop


@dataclass(frozen=True)
class FaultSlot:
    fault_id: str
    kind: str
    target: str  # a selector the nemesis resolves, e.g. "redis-master-of:test_sub_client_0_0"
    start_s: float
    end_s: float
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    scenario: str
    seed: int
    duration_s: float
    clients: tuple[ClientPlan, ...]
    publishes: tuple[PublishPlan, ...]
    subscriber_actions: tuple[SubscriberAction, ...]
    faults: tuple[FaultSlot, ...] = ()
    version: int = PLAN_VERSION

    # -- queries ------------------------------------------------------------------------------------
    def client(self, client_id: str) -> ClientPlan:
        for client in self.clients:
            if client.client_id == client_id:
                return client
        raise KeyError(client_id)

    def publishers(self) -> tuple[ClientPlan, ...]:
        return tuple(c for c in self.clients if c.role == PUBLISHER)

    def subscribers(self) -> tuple[ClientPlan, ...]:
        return tuple(c for c in self.clients if c.role == SUBSCRIBER)

    def publisher_ids(self) -> dict[int, str]:
        """payload publisher index -> client id."""
        return {c.publisher_index: c.client_id for c in self.clients if c.publisher_index is not None}

    # -- codec --------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return _plain(self)

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no whitespace, one trailing newline (byte-identical per input)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                          allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text: str, *, source: str = "plan.json") -> Plan:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise PlanError(f"{source}: not valid JSON: {error}") from error
        return cls.from_dict(data, source=source)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "plan") -> Plan:
        if not isinstance(data, Mapping):
            raise PlanError(f"{source}: expected a JSON object")
        version = data.get("version")
        if version != PLAN_VERSION:
            raise PlanError(f"{source}: plan version {version!r} is not supported (this Ordeal reads "
                            f"version {PLAN_VERSION}); re-plan from the scenario and seed")
        try:
            return cls(
                scenario=data["scenario"],
                seed=data["seed"],
                duration_s=data["duration_s"],
                clients=tuple(
                    ClientPlan(**{**c, "subscriptions": tuple(Subscription(**s) for s in c["subscriptions"]),
                                  "will": WillPlan(**c["will"]) if c.get("will") is not None else None})
                    for c in data["clients"]),
                publishes=tuple(PublishPlan(**p) for p in data["publishes"]),
                subscriber_actions=tuple(SubscriberAction(**a) for a in data["subscriber_actions"]),
                faults=tuple(FaultSlot(**{**f, "params": dict(f.get("params", {}))}) for f in data["faults"]),
                version=version,
            )
        except (KeyError, TypeError) as error:
            raise PlanError(f"{source}: malformed plan: {error}") from error

    def summary(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "seed": self.seed,
            "duration_s": self.duration_s,
            "publishers": len(self.publishers()),
            "subscribers": len(self.subscribers()),
            "publishes": len(self.publishes),
            "subscriber_actions": len(self.subscriber_actions),
            "faults": len(self.faults),
        }


def _plain(value: Any) -> Any:
    """``dataclasses.asdict``, but a field a class lists in OMITTED_AT_DEFAULT is left out while it holds its
    default: fields added later (the MQTT 5 options) keep the plan.json of a scenario that does not use them
    byte-identical to the one an older Ordeal wrote, and reading it back gives the defaults."""
    if is_dataclass(value) and not isinstance(value, type):
        omitted = getattr(value, "OMITTED_AT_DEFAULT", ())
        out = {}
        for f in fields(value):
            item = getattr(value, f.name)
            if f.name in omitted and item == f.default:
                continue
            out[f.name] = _plain(item)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value
