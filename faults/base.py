"""The nemesis' vocabulary: fault descriptions, evidence, the kind registry and parameter validation.

A fault is described by plain data (:class:`FaultSpec`: id, kind, target selector, params) so plans can
carry it as JSON.  The registry maps each kind to a :class:`KindInfo` (one-line description, category,
parameter schema, whether it needs a target, and the factory that builds the live :class:`Fault`).

A live fault has ``apply(ctx) -> Evidence`` and ``heal(ctx) -> Evidence``.  Evidence is plain data: a list
of checks, each saying what was checked, what was observed, and whether it showed the fault biting.
A fault that cannot be applied raises :class:`FaultNotApplicable` with the reason; the run then becomes
unknown — it is never silently skipped.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from contracts.errors import UsageError
from contracts.topology import Topology

CATEGORIES = ("process", "redis", "network", "client")


class FaultError(Exception):
    """Base of the nemesis' own errors."""


class FaultSpecError(FaultError, UsageError):
    """A fault description is invalid (unknown kind, bad parameter, bad target selector): input that cannot
    be used, found when the scenario or plan is validated."""


class FaultNotApplicable(FaultError):
    """The fault cannot be applied here (not root, no private namespace, target not found, ...)."""


@dataclass(frozen=True)
class Check:
    """One observation made to prove (or disprove) that a fault took effect or was healed."""

    what: str  # e.g. "pid gone", "port refuses", "replica promoted", "drop counter"
    observed: Mapping[str, Any]
    ok: bool

    def to_dict(self) -> dict[str, Any]:
        return {"what": self.what, "observed": dict(self.observed), "ok": self.ok}


@dataclass(frozen=True)
class Evidence:
    """What the nemesis checked after applying or healing a fault.  ``bit`` = every check held."""

    checks: tuple[Check, ...]

    @property
    def bit(self) -> bool:
        return bool(self.checks) and all(check.ok for check in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"bit": self.bit, "checks": [check.to_dict() for check in self.checks]}

    @staticmethod
    def of(*checks: Check) -> Evidence:
        return Evidence(tuple(checks))

    def plus(self, *checks: Check) -> Evidence:
        return Evidence(self.checks + tuple(checks))


@dataclass(frozen=True)
class FaultSpec:
    """A fault as plain data, as a plan carries it."""

    id: str
    kind: str
    target: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "target": self.target, "params": dict(self.params)}


_REQUIRED = object()


@dataclass(frozen=True)
class Param:
    """One parameter of a fault kind: its type, default and allowed values."""

    name: str
    type: type | tuple[type, ...]
    default: Any = _REQUIRED
    help: str = ""
    choices: tuple[Any, ...] | None = None
    min: float | None = None
    max: float | None = None
    # Extra check for values the type cannot express (e.g. a group selector); returns an error or None.
    check: Callable[[Any], str | None] | None = None

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED

    def describe(self) -> str:
        type_names = "|".join(t.__name__ for t in (self.type if isinstance(self.type, tuple) else (self.type,)))
        bits = [f"{self.name}: {type_names}"]
        if self.choices is not None:
            bits.append("one of " + ", ".join(repr(c) for c in self.choices))
        if self.min is not None or self.max is not None:
            bits.append(f"in [{self.min if self.min is not None else '-inf'}, "
                        f"{self.max if self.max is not None else 'inf'}]")
        bits.append("required" if self.required else f"default {self.default!r}")
        return " ".join(bits)

    def validate(self, kind: str, value: Any) -> Any:
        where = f"fault kind {kind!r}: parameter {self.name!r}"
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        # bool is an int in Python; never accept True for a number or 1 for a flag.
        type_ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if float in types and isinstance(value, int) and not isinstance(value, bool):
            type_ok = True
            value = float(value)
        if not type_ok:
            raise FaultSpecError(f"{where} = {value!r}: expected {self.describe()}")
        if self.choices is not None and value not in self.choices:
            raise FaultSpecError(f"{where} = {value!r}: expected one of {', '.join(map(repr, self.choices))}")
        if self.min is not None and value < self.min:
            raise FaultSpecError(f"{where} = {value!r}: must be >= {self.min}")
        if self.max is not None and value > self.max:
            raise FaultSpecError(f"{where} = {value!r}: must be <= {self.max}")
        if self.check is not None:
            problem = self.check(value)
            if problem:
                raise FaultSpecError(f"{where} = {value!r}: {problem}")
        return value


@dataclass
class FaultContext:
    """What a fault needs at run time.

    ``topology``: the nodes faults act on (contracts.topology.Topology: ``redis_nodes``, ``kafka``,
    ``storage``, ``brokers`` as node handles, ``client_hosts``, ...; a test's stand-in may hold only the
    members its faults read).  ``seed`` makes random target choices reproducible; ``record(kind,
    **columns)`` writes a history row (may be None in tests).
    """

    topology: Topology
    seed: int = 0
    record: Callable[..., None] | None = None
    # How long faults wait for an effect to show (a replica promotion, a failover, a port to close).
    effect_timeout_s: float = 10.0
    # How long a heal waits for a restarted node to be ready.
    ready_timeout_s: float = 30.0
    # The reference broker's Redis key prefix (BrokerConfig.key_prefix), for "broker-holding:CLIENT".
    broker_key_prefix: str = ""

    def rng_for(self, fault_id: str) -> random.Random:
        """A random source for one fault: the same seed and fault id always choose the same target."""
        return random.Random(f"{self.seed}:{fault_id}")

    def note_node_event(self, node_name: str, action: str, fault_id: str | None = None, **detail: Any) -> None:
        """A node_event row for something the nemesis did to a node (fault_id: the fault it served)."""
        if self.record is not None:
            self.record("node_event", node=node_name, fault_id=fault_id,
                        detail={"action": action, "by": "nemesis", **detail})


class Fault(Protocol):
    spec: FaultSpec

    def apply(self, ctx: FaultContext) -> Evidence: ...

    def heal(self, ctx: FaultContext) -> Evidence: ...


@dataclass(frozen=True)
class KindInfo:
    """A fault kind in the registry."""

    name: str
    description: str  # one line
    category: str  # one of CATEGORIES
    params: tuple[Param, ...]
    target: str  # "node" (a node selector), "client" (a client id) or "none"
    factory: Callable[[FaultSpec], Fault] | None  # None: played by the executor, not the nemesis
    instant: bool = False  # no lasting effect to heal (restart, failover): heal only re-checks

    def param(self, name: str) -> Param:
        for param in self.params:
            if param.name == name:
                return param
        raise KeyError(name)


_REGISTRY: dict[str, KindInfo] = {}

# name -> one-line description, for scenario validation and `ordeal` help.  Filled by register().
FAULT_KINDS: dict[str, str] = {}


def register(info: KindInfo) -> KindInfo:
    if info.category not in CATEGORIES:
        raise ValueError(f"fault kind {info.name!r}: category {info.category!r} not in {CATEGORIES}")
    if info.name in _REGISTRY:
        raise ValueError(f"fault kind {info.name!r} registered twice")
    _REGISTRY[info.name] = info
    FAULT_KINDS[info.name] = info.description
    return info


def kind_info(kind: str) -> KindInfo:
    try:
        return _REGISTRY[kind]
    except KeyError:
        allowed = ", ".join(sorted(_REGISTRY)) or "(none registered: import faults.catalog)"
        raise FaultSpecError(f"unknown fault kind {kind!r}; allowed kinds: {allowed}") from None


def registered_kinds() -> dict[str, KindInfo]:
    return dict(_REGISTRY)


def normalise_params(kind: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """Check ``params`` against the kind's schema and fill defaults; errors name the kind and parameter."""
    info = kind_info(kind)
    given = dict(params or {})
    known = {param.name for param in info.params}
    unknown = sorted(set(given) - known)
    if unknown:
        allowed = "; ".join(param.describe() for param in info.params) or "none"
        raise FaultSpecError(f"fault kind {kind!r}: unknown parameter(s) {', '.join(unknown)}; "
                             f"allowed: {allowed}")
    result: dict[str, Any] = {}
    for param in info.params:
        if param.name in given:
            result[param.name] = param.validate(kind, given[param.name])
        elif param.required:
            raise FaultSpecError(f"fault kind {kind!r}: missing required parameter {param.describe()}")
        else:
            result[param.name] = param.default
    return result
