"""The whole fault catalog: importing this module registers every kind.

    from faults.catalog import FAULT_KINDS, validate_spec, build_fault

``validate_spec`` turns a plan's fault (a dict or a FaultSpec) into a normalised FaultSpec (defaults
filled) or raises FaultSpecError naming the fault, the kind/parameter/target and what is allowed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from contracts import scenario as scenario_model
from contracts.target_nodes import BROKER
from faults import client, failure_paths, latency, network, power, process, redis_failover  # noqa: F401  (registration side effects)
from faults.base import (
    FAULT_KINDS,
    Fault,
    FaultSpec,
    FaultSpecError,
    KindInfo,
    kind_info,
    normalise_params,
    registered_kinds,
)
from faults.clock import CLOCK_KINDS  # also registers the clock kinds
from faults.clock import check_spec as check_clock_spec
from faults.commit_hold import check_spec as check_commit_spec
from faults.commit_hold import provider_param_gap
from faults.disk import DISK_KINDS, FILE_KINDS  # also registers the disk kinds
from faults.latency import LINK_KINDS
from faults.latency import check_spec as check_link_spec
from faults.network import RING_MIN_NODES
from faults.selectors import SELECTOR_HELP, kafka_role_of, parse_selector

__all__ = ["FAULT_KINDS", "validate_spec", "build_fault", "is_client_fault", "kinds_by_category",
           "PROVIDER_GAPS", "provider_supports", "unsupported_faults", "unsupported_params"]

# Which fault kinds each topology provider lacks, and why (every kind not listed here is supported).  One
# source: scenario loading refuses a scenario that asks a provider for one of these (exit code 3), and
# docs/faults.md prints this table.
PROVIDER_GAPS: dict[str, dict[str, str]] = {
    "local": {},
    "containers": {
        "net_bandwidth": "bandwidth limits are tc htb classes on the harness' lo; container traffic crosses the "
                         "run's bridge instead, and no shaping for it is built (no netem in this kernel, no "
                         "toxiproxy binary on these machines)",
        **{kind: "link faults go through a toxiproxy on the link; on this provider that is meant to be the real "
                 "toxiproxy image, and no image registry is reachable here to get it, while the harness' own "
                 "proxy (harness/toxiproxy/) is routed for the local provider's links only (client -> broker, "
                 "broker -> Kafka, broker -> Redis)"
           for kind in LINK_KINDS},
        **{kind: "clock faults preload libfaketime into the node processes the harness starts; a container runs "
                 "its image's processes, which would need libfaketime inside every image and the offset file "
                 "mounted in: not built" for kind in CLOCK_KINDS},
        **{kind: "disk faults act on a node's data directory as the harness reaches it (a size-limited tmpfs in the "
                 "run's mount namespace for disk_full, the host directory for the file faults); a container's data "
                 "lives in its own mount namespace and none of this is built for it" for kind in DISK_KINDS},
        "power_loss": "power_loss needs the node's data directory on the harness' lazyfs mount (a FUSE process the "
                      "local provider starts before the node); a container's data directory lives in its own mount "
                      "namespace and no lazyfs is built into the images",
    },
}


def provider_supports(provider: str, kind: str) -> bool:
    return kind not in PROVIDER_GAPS.get(provider, {})


def unsupported_faults(provider: str, kinds: Iterable[str]) -> list[str]:
    """One sentence per kind the provider lacks: 'fault KIND is not supported by provider P: REASON'."""
    gaps = PROVIDER_GAPS.get(provider, {})
    return [f"fault {kind!r} is not supported by provider {provider!r}: {gaps[kind]}"
            for kind in sorted(set(kinds)) if kind in gaps]


def unsupported_params(provider: str, kind: str, params: Mapping[str, Any]) -> str:
    """Why the provider cannot play a kind it supports with these parameters (process_kill / process_pause
    ``at_commit`` on the containers provider: faults/commit_hold.py), or ''."""
    return provider_param_gap(provider, kind, params)


def validate_spec(fault: FaultSpec | Mapping[str, Any]) -> FaultSpec:
    if isinstance(fault, Mapping):
        unknown = sorted(set(fault) - {"id", "kind", "target", "params"})
        if unknown:
            raise FaultSpecError(f"fault {fault.get('id')!r}: unknown field(s) {', '.join(unknown)}; "
                                 "allowed: id, kind, target, params")
        if not isinstance(fault.get("id"), str) or not fault.get("id"):
            raise FaultSpecError(f"fault {dict(fault)!r}: 'id' must be a non-empty string")
        if not isinstance(fault.get("kind"), str):
            raise FaultSpecError(f"fault {fault['id']!r}: 'kind' must be a string, one of "
                                 f"{', '.join(sorted(FAULT_KINDS))}")
        params = fault.get("params") or {}
        if not isinstance(params, Mapping):
            raise FaultSpecError(f"fault {fault['id']!r}: 'params' must be a table/object, got {params!r}")
        fault = FaultSpec(fault["id"], fault["kind"], fault.get("target"), dict(params))
    try:
        info = kind_info(fault.kind)
        params = normalise_params(fault.kind, fault.params)
        target = _validate_target(info, fault.target)
        check_clock_spec(fault.kind, target, params)  # clock faults: a runtime libfaketime cannot reach
        check_link_spec(fault.kind, target, params)  # link faults: a target that is not on the link
        check_commit_spec(fault.kind, target, params)  # at_commit: the Kafka broker only, not with at_stage
    except FaultSpecError as error:
        raise FaultSpecError(f"fault {fault.id!r}: {error}") from None
    return FaultSpec(fault.id, fault.kind, target, params)


def _validate_target(info: KindInfo, target: Any) -> str | None:
    if info.target == "none":
        if target not in (None, ""):
            raise FaultSpecError(f"fault kind {info.name!r} takes no target (got {target!r}); "
                                 "its parameters say what it hits")
        return None
    if info.target == "client":
        if not isinstance(target, str) or not target:
            raise FaultSpecError(f"fault kind {info.name!r}: target must be a client id, got {target!r}")
        return target
    if target is None:
        raise FaultSpecError(f"fault kind {info.name!r} needs a target: one of {SELECTOR_HELP}")
    return str(parse_selector(target))


def build_fault(spec: FaultSpec) -> Fault:
    """The live fault for a (validated) spec; client faults have none (the executor plays them)."""
    info = kind_info(spec.kind)
    if info.factory is None:
        raise FaultSpecError(f"fault {spec.id!r}: kind {spec.kind!r} is played by the executor, not the nemesis")
    return info.factory(spec)


def is_client_fault(kind: str) -> bool:
    return kind_info(kind).category == "client"


def kinds_by_category() -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for name, info in sorted(registered_kinds().items()):
        grouped.setdefault(info.category, []).append(name)
    return grouped


# Node targets a kind draws from when the scenario names none: the slot owner of a steady subscriber's
# messages (the fault that matters most for a session store), any replica, the Kafka broker, a broker node.
DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {
    "process_kill": ("redis-master-of:{subscriber}", "redis-random-replica", "kafka", "broker-random"),
    "process_stop": ("redis-master-of:{subscriber}", "redis-random-replica", "kafka", "broker-random"),
    "process_pause": ("redis-master-of:{subscriber}", "redis-random-replica"),
    "process_restart": ("redis-master-of:{subscriber}", "kafka", "broker-random"),
    "redis_failover": ("redis-master-of:{subscriber}",),
    "net_isolate": ("redis-master-of:{subscriber}",),
    "client_flap": ("{subscriber}",),
    "redis_write_stall": ("redis-master-of:{subscriber}",),
    "redis_outage": ("redis-master-of:{subscriber}",),
    "kafka_outage_during_save": ("kafka",),
    **{kind: ("broker-random",) for kind in LINK_KINDS},
    **{kind: ("broker-random",) for kind in CLOCK_KINDS},
    **{kind: ("redis-master-of:{subscriber}", "redis-random-replica") for kind in DISK_KINDS},
    "power_loss": ("redis-master-of:{subscriber}",),
}
# Fault kinds that take a node down (its memory is gone): on an in-memory Kafka log they lose the log.
LOG_LOSING_KINDS = ("process_kill", "process_stop", "process_restart", "kafka_outage_during_save")
LOG_LOSING_KINDS += FILE_KINDS  # faults/disk.py: they SIGKILL the node before damaging its file
LOG_LOSING_KINDS += ("power_loss",)  # faults/power.py: a SIGKILL (and the unsynced writes with it)

# What an external target has: its nodes (node:<name>; the broker nodes also as broker:N, broker-random,
# broker-minority, broker-majority, broker-holding:CLIENT) and its clients.
EXTERNAL_NODE_SELECTORS = ("node", "broker", "broker-random", "broker-minority", "broker-majority",
                           "broker-holding")
EXTERNAL_GROUPS = ("client", "broker")
GROUP_KEYS = ("a", "b", "src", "dst", "group")  # the parameters of the network kinds that hold groups


def external_refusal(kind: str, selectors: tuple[str, ...], variants: list[Mapping[str, Any]],
                     nodes: tuple[tuple[str, str], ...]) -> str:
    """Why a fault of ``kind`` cannot apply to an external target whose nodes are ``nodes`` ((name, role)
    pairs, brokers in their order), as "<key>: <why>", or ''.  A black box is its nodes and its clients: no
    Redis Cluster, no Kafka, no storage server."""
    from faults.selectors import ROLE_GROUPS, parse_group

    names = [node[0] for node in nodes]  # (name, role) or, with power_loss's data-dir knowledge, (name, role, own)
    brokers = [node[0] for node in nodes if node[1] == BROKER]
    has = (f"this target has one node: node:{names[0]}" if len(names) == 1 else
           f"this target's nodes: {', '.join(f'node:{name}' for name in names)} (brokers: broker:1..{len(brokers)})")

    def node_problem(text: str) -> str:
        selector = parse_selector(text)
        if selector.how not in EXTERNAL_NODE_SELECTORS:
            return (f"it selects {text!r}, a node of the reference topology (Redis / Kafka / storage); {has}")
        if selector.how == "node" and selector.arg not in names:
            return f"there is no node {selector.arg!r}; {has}"
        if selector.how == "broker" and int(selector.arg or 0) > len(brokers):
            return f"there is no broker:{selector.arg}; {has}"
        return ""

    info = kind_info(kind)
    if kind in DISK_KINDS:
        return (f"mix.{kind}: disk faults need the node's data directory in the harness' reach (disk_full: on a "
                "size-limited tmpfs the run mounts before the node starts); a black-box target's nodes are not "
                "prepared that way")
    if kind == "power_loss" and (why := power.external_power_refusal(selectors, nodes)):
        # A node's data directory goes on lazyfs when the harness gives it ({data_dir}): harness/external_target.py
        return why
    # Clock faults reach an external target's nodes: the harness starts them, under libfaketime when the plan has
    # a clock fault (harness/external_target.py prepare_clocks).
    if kind in LINK_KINDS:
        return (f"mix.{kind}: link faults route the reference topology's links (client -> broker, broker -> Kafka, "
                "broker -> Redis) through the harness' toxiproxy; a black-box target's links are not routed "
                "through it")
    if info.category == "redis":
        return (f"mix.{kind}: {kind} needs the reference topology's Redis Cluster, which a black-box target "
                "does not have")
    if info.target == "node":
        for text in selectors:
            problem = node_problem(text)
            if problem:
                return f"targets.{kind} = {text!r}: {problem}"
    if kind == "net_partition_ring" and len(brokers) < RING_MIN_NODES:
        return (f"mix.{kind}: a majorities ring needs at least {RING_MIN_NODES} broker nodes (with fewer, every pair "
                f"is within a majority's reach and nothing would be cut); {has}")
    for params in variants:
        keys = [key for key in GROUP_KEYS if key in params]
        with_clients = False  # a side holds clients: a partition of clients from nodes, which one node allows
        for key in keys:
            for member in parse_group(params[key]):
                plain = member.lstrip("-")
                if plain in ROLE_GROUPS and plain not in EXTERNAL_GROUPS:
                    return (f"params.{kind}.{key} = {params[key]!r}: it has no {plain} nodes (groups: client, "
                            f"client:ID, broker, a node selector; {has})")
                if plain == "client" or plain.startswith("client:"):
                    with_clients = True
                elif plain != "broker" and (problem := node_problem(plain)):
                    return f"params.{kind}.{key} = {params[key]!r}: {problem}"
        if keys and not with_clients and len(brokers) < 2:
            return (f"params.{kind}.{keys[0]} = {params[keys[0]]!r}: a partition between broker nodes needs at least "
                    f"two; {has}")
    return ""


# The scenario model (contracts/scenario.py) imports no stage: the fault kinds are registered into it here.
scenario_model.register_fault_catalog(scenario_model.FaultCatalog(
    kinds=tuple(sorted(FAULT_KINDS)),
    target_type=lambda kind: kind_info(kind).target,
    validate=validate_spec,
    full_params=normalise_params,
    default_targets=DEFAULT_TARGETS,
    log_losing_kinds=LOG_LOSING_KINDS,
    kafka_role_of=kafka_role_of,
    external_refusal=external_refusal,
    provider_gaps=unsupported_faults,
    provider_param_gaps=unsupported_params,
))
