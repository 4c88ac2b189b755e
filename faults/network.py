"""Network faults: real kernel packet drops (nftables) and bandwidth limits (tc), only inside the run's
private network namespace.

Every fault gets its own base chain on the *input* hook of table ``inet ordeal_chaos`` (on output the
sender would get EPERM instead of silence), and each drop rule carries a ``counter``: the evidence that
the fault bit is that the counters saw packets by heal time.  Heal deletes the fault's chain (the table
goes with the last chain).  Bandwidth limits use an htb class on ``lo`` with u32 filters for the address
pairs; the evidence is the class' packet count.

Guard: these faults refuse to run (FaultNotApplicable, so the run becomes unknown) unless the process is
root, inside a private network namespace the run created (the harness sets ORDEAL_NETNS=private when it
enters one, harness/netns.py) and that namespace has no interface but ``lo`` — never the host's tables.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass

import psutil

from contracts.topology import Topology
from faults.base import (
    Check,
    Evidence,
    FaultContext,
    FaultNotApplicable,
    FaultSpec,
    KindInfo,
    Param,
    register,
)
from faults.selectors import all_nodes, group_error, resolve_group, resolve_nodes

TABLE = "ordeal_chaos"
NETNS_MARKER = "ORDEAL_NETNS"  # same name and value as harness/netns.py MARKER (faults may not import harness)
_lock = threading.Lock()  # one nft / tc change at a time: "delete the table when empty" must not race


def _run(argv: list[str], stdin: str | None = None) -> str:
    result = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=10)
    if result.returncode != 0:
        raise FaultNotApplicable(f"`{' '.join(argv)}` failed ({result.returncode}): {result.stderr.strip()}"
                                 + (f"\ninput:\n{stdin}" if stdin else ""))
    return result.stdout


def interfaces() -> list[str]:
    """Interfaces of *this thread's* network namespace (/sys/class/net shows sysfs' namespace instead)."""
    with open("/proc/thread-self/net/dev") as dev:
        lines = dev.read().splitlines()[2:]  # two header lines
    return sorted(line.split(":", 1)[0].strip() for line in lines if ":" in line)


def require_private_netns(what: str, place: NftPlace | None = None) -> None:
    """Refuse, with the reason, unless network faults are safe and possible here."""
    place = place or LOCAL_PLACE
    if os.geteuid() != 0:
        raise FaultNotApplicable(f"{what}: network faults need root (nftables/tc in a private network "
                                 f"namespace); this process runs as uid {os.geteuid()}")
    if os.environ.get(NETNS_MARKER) != "private":
        raise FaultNotApplicable(f"{what}: network faults run only inside the run's private network "
                                 f"namespace ({NETNS_MARKER}=private, set by harness/netns.py); this run "
                                 "was not started isolated")
    others = [name for name in interfaces()
              if name != "lo" and not name.startswith(place.allowed_interfaces or ("\0",))]
    if others:
        raise FaultNotApplicable(f"{what}: refusing to touch this network namespace: it has interfaces "
                                 f"{', '.join(others)} besides lo, so it is not a private one the run created")
    for tool in ("nft", "tc"):
        if shutil.which(tool) is None:
            raise FaultNotApplicable(f"{what}: `{tool}` is not installed (apt-get install nftables iproute2)")


@dataclass(frozen=True)
class NftPlace:
    """Where a topology's drop rules go.  Local nodes share the harness' namespace on their own 127.0.0.x:
    one chain on the inet input hook.  Containers (harness/containers/) sit on the run's bridge inside the
    harness' namespace: bridge-family chains on the forward (container <-> container), input (container ->
    harness) and output (harness -> container) hooks, so every packet between two addresses meets the rules
    exactly once.  A topology names its place with a ``network_fault_place`` attribute ("bridge")."""

    family: str = "inet"
    hooks: tuple[str, ...] = ("input",)
    # interfaces besides lo the private namespace may hold (name prefixes), e.g. the run's bridge
    allowed_interfaces: tuple[str, ...] = ()

    def chains(self, base: str) -> list[tuple[str, str]]:
        """(chain name, hook) per hook; one hook keeps the plain chain name."""
        if len(self.hooks) == 1:
            return [(base, self.hooks[0])]
        return [(f"{base}_{hook[:3]}", hook) for hook in self.hooks]


LOCAL_PLACE = NftPlace()
BRIDGE_PLACE = NftPlace(family="bridge", hooks=("forward", "input", "output"), allowed_interfaces=("podman", "veth"))


def place_of(topology: Topology) -> NftPlace:
    """The topology's ``network_fault_place``: "bridge" (containers) or absent (local)."""
    return {"bridge": BRIDGE_PLACE}.get(getattr(topology, "network_fault_place", None) or "", LOCAL_PLACE)


def chain_name(fault_id: str) -> str:
    """A valid, unique nft chain name for a fault id."""
    clean = re.sub(r"[^A-Za-z0-9_]", "_", fault_id)[:32]
    return f"f_{clean}_{hashlib.blake2b(fault_id.encode(), digest_size=3).hexdigest()}"


def addr_set(addresses: list[str]) -> str:
    return "{ " + ", ".join(sorted(set(addresses))) + " }"


def drop_rules(kind: str, a: list[str], b: list[str], percent: int | None, direction: str) -> list[str]:
    """The rule bodies (after ``add rule inet TABLE CHAIN``) for a fault; pure, unit-tested."""
    random_drop = f"numgen random mod 100 < {percent} " if percent is not None and percent < 100 else ""
    if kind == "isolate":  # the nodes of a keep talking among themselves, not with anything else
        group = a[0] if len(set(a)) == 1 else addr_set(a)
        return [f"ip saddr {group} ip daddr != {group} counter drop",
                f"ip daddr {group} ip saddr != {group} counter drop"]
    if kind == "ring":  # a: the ring's addresses in ring order
        return [rule for x, y in ring_cuts(a) for rule in (f"ip saddr {x} ip daddr {y} counter drop",
                                                           f"ip saddr {y} ip daddr {x} counter drop")]
    if kind == "reject":  # TCP from a to b answered with a reset: the sender fails at once (redis_outage)
        return [f"ip saddr {addr_set(a)} ip daddr {addr_set(b)} meta l4proto tcp counter reject with tcp reset"]
    rules = [f"ip saddr {addr_set(a)} ip daddr {addr_set(b)} {random_drop}counter drop"]
    if direction == "both":
        rules.append(f"ip saddr {addr_set(b)} ip daddr {addr_set(a)} {random_drop}counter drop")
    return rules


def ring_cuts(ring: list[str]) -> list[tuple[str, str]]:
    """Jepsen's majorities ring: the nodes in a ring, each keeping its links to the nearest ceil((m - 1) / 2) on
    either side (m: a majority of them), so that every node sees a majority and no two see the same one; every
    other pair is cut.  Five nodes: each keeps its two neighbours, five pairs are cut.  Pure, unit-tested."""
    count = len(ring)
    keep = -(-(count // 2) // 2)  # ceil((m - 1) / 2) with m = count // 2 + 1
    return [(ring[i], ring[j]) for i in range(count) for j in range(i + 1, count)
            if min(j - i, count - (j - i)) > keep]


def parse_counters(nft_json: str) -> list[dict[str, int]]:
    """Packets/bytes of every counter in `nft -j list chain` output, rule by rule."""
    counters = []
    for item in json.loads(nft_json).get("nftables", []):
        rule = item.get("rule")
        if not rule:
            continue
        for expression in rule.get("expr", []):
            if isinstance(expression, dict) and "counter" in expression:
                counters.append({"packets": int(expression["counter"]["packets"]),
                                 "bytes": int(expression["counter"]["bytes"])})
    return counters


def _check_disjoint(spec: FaultSpec, a: dict[str, str], b: dict[str, str]) -> None:
    shared = sorted(set(a.values()) & set(b.values()))
    if shared:
        raise FaultNotApplicable(
            f"fault {spec.id}: both sides share address(es) {', '.join(shared)} ({sorted(a)} vs {sorted(b)}); "
            "a network fault needs every node on its own 127.0.0.x (a topology started isolated)")


def RejectFault(spec: FaultSpec) -> DropFault:  # noqa: N802 - a factory named like the class it makes
    """TCP from params.src to params.dst reset by nftables (counted): used by faults/failure_paths.py."""
    return DropFault(spec, "reject")


class DropFault:
    """partition / one-way partition / lossy link / isolate: nft drop rules with counters."""

    def __init__(self, spec: FaultSpec, shape: str) -> None:
        self.spec = spec
        self.shape = shape  # "partition" | "oneway" | "lossy" | "isolate" | "reject" (src -> dst, TCP reset)
        self.chain = chain_name(spec.id)
        self.installed = False
        self.sides: dict[str, dict[str, str]] = {}

    def _sides(self, ctx: FaultContext) -> tuple[list[str], list[str], str, int | None]:
        rng = ctx.rng_for(self.spec.id)
        params = self.spec.params
        if self.shape == "isolate":
            nodes = resolve_nodes(ctx.topology, self.spec.target, rng, ctx.broker_key_prefix)
            self.sides = {"node": {node.name: node.host for node in nodes}}
            for node in nodes:
                if node.host == "127.0.0.1":
                    raise FaultNotApplicable(f"fault {self.spec.id}: {node.name} listens on 127.0.0.1, shared "
                                             "with everything; isolating it needs a topology started isolated")
            return sorted({node.host for node in nodes}), [], "both", None
        if self.shape == "ring":
            members = resolve_group(ctx.topology, params["group"], rng, ctx.broker_key_prefix)
            if len(members) < RING_MIN_NODES:
                raise FaultNotApplicable(f"fault {self.spec.id}: a majorities ring needs at least {RING_MIN_NODES} "
                                         f"nodes; group {params['group']!r} has {len(members)}: {sorted(members)}")
            order = sorted(members)
            rng.shuffle(order)  # which nodes are neighbours: seeded
            self.sides = {"ring": {name: members[name] for name in order}}
            return [members[name] for name in order], [], "both", None
        src_key, dst_key = ("src", "dst") if self.shape in ("oneway", "reject") else ("a", "b")
        cache: dict = {}
        a = resolve_group(ctx.topology, params[src_key], rng, ctx.broker_key_prefix, cache)
        b = resolve_group(ctx.topology, params[dst_key], rng, ctx.broker_key_prefix, cache)
        _check_disjoint(self.spec, a, b)
        self.sides = {src_key: a, dst_key: b}
        direction = "oneway" if self.shape in ("oneway", "reject") else params.get("direction", "both")
        return list(a.values()), list(b.values()), direction, params.get("percent")

    def apply(self, ctx: FaultContext) -> Evidence:
        self.place = place_of(ctx.topology)
        family = self.place.family
        require_private_netns(f"fault {self.spec.id} ({self.spec.kind})", self.place)
        a, b, direction, percent = self._sides(ctx)
        rules = drop_rules(self.shape if self.shape in ("isolate", "reject", "ring") else "drop", a, b, percent,
                           direction)
        chains = self.place.chains(self.chain)
        script = "\n".join([f"add table {family} {TABLE}", *(line for chain, hook in chains for line in (
            f"add chain {family} {TABLE} {chain} {{ type filter hook {hook} priority 0; policy accept; }}",
            *(f"add rule {family} {TABLE} {chain} {rule}" for rule in rules)))]) + "\n"
        with _lock:
            _run(["nft", "-f", "-"], stdin=script)
            self.installed = True
            listed = self.counters()
        sides = list(self.sides.values())
        return Evidence.of(
            Check("drop rules installed", {"table": f"{family} {TABLE}", "chain": self.chain, "rules": rules,
                                           "hooks": list(self.place.hooks), "sides": self.sides,
                                           "installed_rules": len(listed)},
                  len(listed) == len(rules) * len(chains)),
            traffic_check(ctx.topology, sides[0], sides[1] if len(sides) > 1 else None),
        )

    def counters(self) -> list[dict[str, int]]:
        place = getattr(self, "place", LOCAL_PLACE)
        return [counter for chain, _hook in place.chains(self.chain)
                for counter in parse_counters(_run(["nft", "-j", "list", "chain", place.family, TABLE, chain]))]

    def heal(self, ctx: FaultContext) -> Evidence:
        if not self.installed:
            return Evidence.of(Check("nothing installed", {"chain": self.chain}, True))
        place = getattr(self, "place", LOCAL_PLACE)
        with _lock:
            counters = self.counters()
            _run(["nft", "-f", "-"], stdin="".join(
                f"flush chain {place.family} {TABLE} {chain}\ndelete chain {place.family} {TABLE} {chain}\n"
                for chain, _hook in place.chains(self.chain)))
            self.installed = False
            _delete_table_if_empty(place.family)
            remaining = _run(["nft", "list", "tables"])
        gone = f"chain {self.chain}" not in _list_table_or_empty(place.family)
        dropped = sum(counter["packets"] for counter in counters)
        return Evidence.of(
            Check("packets dropped", {"counters": counters, "packets": dropped}, dropped > 0),
            Check("drop rules removed", {"chain": self.chain, "tables": remaining.split()}, gone),
        )


def misrouted_connections(topology: Topology, side: dict[str, str], other: dict[str, str] | None) -> list[dict]:
    """TCP connections a node of ``side`` opened towards ``other`` (None: anywhere) from an address that is
    not its side's: rules keyed on addresses cannot see that traffic.  (A process that does not bind its
    outgoing sockets leaves from 127.0.0.1 whatever address it listens on.)"""
    nodes = {node.name: node for node in all_nodes(topology)}
    found = []
    for name in side:
        node = nodes.get(name)
        if node is None or not node.pid:
            continue
        try:
            process = psutil.Process(node.pid)
            processes = [process, *process.children(recursive=True)]
            connections = [conn for proc in processes for conn in proc.net_connections(kind="tcp")]
        except psutil.Error:
            continue
        # Why: a node's connections to itself (RabbitMQ's Erlang VM <-> its own epmd on 127.0.0.1:4369) never
        # cross between the sides; both ends are this node's processes.
        own = {(conn.laddr.ip, conn.laddr.port) for conn in connections}
        for conn in connections:
            if not conn.raddr or (conn.laddr.ip == node.host and conn.laddr.port == node.port):
                continue  # not connected, or a connection the node accepted on its own address
            if (conn.raddr.ip, conn.raddr.port) in own:
                continue  # inside the node's own process tree
            towards_other = other is None or conn.raddr.ip in other.values()
            if towards_other and conn.laddr.ip not in side.values():
                found.append({"node": name, "local": f"{conn.laddr.ip}:{conn.laddr.port}",
                              "remote": f"{conn.raddr.ip}:{conn.raddr.port}"})
    return found


def traffic_check(topology: Topology, a: dict[str, str], b: dict[str, str] | None) -> Check:
    misrouted = misrouted_connections(topology, a, b) + (misrouted_connections(topology, b, a) if b else [])
    return Check("traffic between the sides uses the nodes' addresses",
                 {"misrouted": misrouted[:20], "misrouted_count": len(misrouted)}, not misrouted)


def _list_table_or_empty(family: str = "inet") -> str:
    result = subprocess.run(["nft", "list", "table", family, TABLE], capture_output=True, text=True, timeout=10)
    return result.stdout if result.returncode == 0 else ""


def _delete_table_if_empty(family: str = "inet") -> None:
    listed = _list_table_or_empty(family)
    if listed and "chain " not in listed:
        _run(["nft", "delete", "table", family, TABLE])


# --- bandwidth limit (tc htb on lo) -----------------------------------------------------------------

_QDISC_HANDLE = "1:"
_next_class = [10]  # class ids handed out per bandwidth fault (guarded by _lock)


def parse_class_stats(tc_text: str, classid: str) -> dict[str, int] | None:
    """Packets/bytes/drops/overlimits of one class in `tc -s class show` text (this tc has no JSON for
    classes): "class htb 1:10 ... \n Sent 356113 bytes 35 pkt (dropped 0, overlimits 12 requeues 0)"."""
    blocks = re.split(r"\n(?=class )", tc_text)
    for block in blocks:
        header = block.split()
        if len(header) >= 3 and header[0] == "class" and header[2] == classid:
            sent = re.search(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)", block)
            if sent is None:
                return None
            sent_bytes, packets, drops, overlimits = (int(value) for value in sent.groups())
            return {"packets": packets, "bytes": sent_bytes, "overlimits": overlimits, "drops": drops}
    return None


class BandwidthFault:
    def __init__(self, spec: FaultSpec) -> None:
        self.spec = spec
        self.classid: str | None = None
        self.prio: int | None = None

    def apply(self, ctx: FaultContext) -> Evidence:
        if place_of(ctx.topology) is not LOCAL_PLACE:
            raise FaultNotApplicable(f"fault {self.spec.id} ({self.spec.kind}): bandwidth limits shape lo only; "
                                     "this topology's traffic crosses a bridge (faults/catalog.py PROVIDER_GAPS)")
        require_private_netns(f"fault {self.spec.id} ({self.spec.kind})")
        params, rng = self.spec.params, ctx.rng_for(self.spec.id)
        cache: dict = {}
        a = resolve_group(ctx.topology, params["a"], rng, ctx.broker_key_prefix, cache)
        b = resolve_group(ctx.topology, params["b"], rng, ctx.broker_key_prefix, cache)
        _check_disjoint(self.spec, a, b)
        pairs = [(src, dst) for src in sorted(set(a.values())) for dst in sorted(set(b.values()))]
        if params["direction"] == "both":
            pairs += [(dst, src) for src, dst in pairs]
        rate, burst = f"{params['rate_kbit']}kbit", f"{params['burst_kb']}kb"
        with _lock:
            qdiscs = _run(["tc", "qdisc", "show", "dev", "lo"])
            if "htb 1:" not in qdiscs:
                # Unclassified traffic ('default 0') bypasses shaping: only the fault's pairs are slowed.
                _run(["tc", "qdisc", "add", "dev", "lo", "root", "handle", _QDISC_HANDLE, "htb", "default", "0"])
            number = _next_class[0]
            _next_class[0] += 1
            self.classid, self.prio = f"1:{number}", number
            _run(["tc", "class", "add", "dev", "lo", "parent", _QDISC_HANDLE, "classid", self.classid, "htb",
                  "rate", rate, "ceil", rate, "burst", burst, "cburst", burst])
            for src, dst in pairs:
                _run(["tc", "filter", "add", "dev", "lo", "parent", _QDISC_HANDLE, "protocol", "ip",
                      "prio", str(self.prio), "u32", "match", "ip", "src", f"{src}/32",
                      "match", "ip", "dst", f"{dst}/32", "flowid", self.classid])
            filters = _run(["tc", "filter", "show", "dev", "lo", "parent", _QDISC_HANDLE])
        installed = filters.count(f"flowid {self.classid} ") + filters.count(f"flowid {self.classid}\n")
        return Evidence.of(Check("bandwidth limit installed",
                                 {"class": self.classid, "rate": rate, "burst": burst, "pairs": pairs,
                                  "sides": {"a": a, "b": b}, "filters": installed},
                                 installed >= len(pairs)),
                           traffic_check(ctx.topology, a, b))

    def heal(self, ctx: FaultContext) -> Evidence:
        if self.classid is None:
            return Evidence.of(Check("nothing installed", {}, True))
        with _lock:
            stats = parse_class_stats(_run(["tc", "-s", "class", "show", "dev", "lo"]), self.classid)
            _run(["tc", "filter", "del", "dev", "lo", "parent", _QDISC_HANDLE, "prio", str(self.prio)])
            _run(["tc", "class", "del", "dev", "lo", "classid", self.classid])
            remaining = _run(["tc", "class", "show", "dev", "lo"])
            if "htb 1:" not in remaining:  # the last shaped class gone: remove the root qdisc
                _run(["tc", "qdisc", "del", "dev", "lo", "root"])
        classid, self.classid = self.classid, None
        return Evidence.of(
            Check("packets shaped", {"class": classid, **(stats or {})}, bool(stats and stats["packets"] > 0)),
            Check("bandwidth limit removed", {"classes_left": remaining.strip().splitlines()},
                  f"htb {classid} " not in remaining),
        )


def heal_all_network() -> list[str]:
    """Remove every network fault (the whole table, the root qdisc on lo).  Returns what was removed.
    Only inside the private namespace; elsewhere there is nothing of ours to remove."""
    removed = []
    try:  # the containers' bridge table (a namespace holding the run's bridge)
        require_private_netns("heal_all", BRIDGE_PLACE)
        with _lock:
            if _list_table_or_empty("bridge"):
                _run(["nft", "delete", "table", "bridge", TABLE])
                removed.append(f"nft table bridge {TABLE}")
    except FaultNotApplicable:
        pass
    try:
        require_private_netns("heal_all")
    except FaultNotApplicable:
        return removed
    with _lock:
        if _list_table_or_empty():
            _run(["nft", "delete", "table", "inet", TABLE])
            removed.append(f"nft table inet {TABLE}")
        if "htb 1:" in _run(["tc", "qdisc", "show", "dev", "lo"]):
            _run(["tc", "qdisc", "del", "dev", "lo", "root"])
            removed.append("tc root qdisc on lo")
    return removed


_GROUP_HELP = "a group: redis, broker, kafka, storage, client, client:ID, a node selector, or a list"
_A = Param("a", (str, list), help="one side: " + _GROUP_HELP, check=group_error)
_B = Param("b", (str, list), help="the other side: " + _GROUP_HELP, check=group_error)
_DIRECTION = Param("direction", str, "both", "drop a->b and b->a, or only a->b", choices=("both", "oneway"))

register(KindInfo(
    name="net_partition", category="network", target="none", factory=lambda spec: DropFault(spec, "partition"),
    description="drop all packets between two groups of nodes, both ways (nftables); heal removes the rules",
    params=(_A, _B),
))
register(KindInfo(
    name="net_partition_oneway", category="network", target="none",
    factory=lambda spec: DropFault(spec, "oneway"),
    description="drop packets from group src to group dst only (dst's replies still flow)",
    params=(Param("src", (str, list), help="senders: " + _GROUP_HELP, check=group_error),
            Param("dst", (str, list), help="receivers: " + _GROUP_HELP, check=group_error)),
))
RING_MIN_NODES = 5  # with fewer, every pair is within a majority's reach: nothing would be cut
register(KindInfo(
    name="net_partition_ring", category="network", target="none", factory=lambda spec: DropFault(spec, "ring"),
    description="Jepsen's majorities ring: the group's nodes (at least 5) in a seeded ring, each still reaching "
                "its nearest neighbours (a majority with itself), every other pair cut both ways",
    params=(Param("group", (str, list), "broker", "the ring's nodes: " + _GROUP_HELP, check=group_error),),
))
register(KindInfo(
    name="net_isolate", category="network", target="node", factory=lambda spec: DropFault(spec, "isolate"),
    description="drop every packet to and from the target node",
    params=(),
))
register(KindInfo(
    name="net_lossy", category="network", target="none", factory=lambda spec: DropFault(spec, "lossy"),
    description="drop percent % of packets between two groups (nft numgen random)",
    params=(_A, _B, Param("percent", int, 30, "share of packets dropped", min=1, max=100), _DIRECTION),
))
register(KindInfo(
    name="net_bandwidth", category="network", target="none", factory=BandwidthFault,
    description="limit the bandwidth between two groups (tc htb on lo)",
    params=(_A, _B, Param("rate_kbit", int, 8000, "rate limit in kbit/s", min=8, max=10_000_000),
            Param("burst_kb", int, 256, "bucket size in KiB (must exceed loopback's 64 KiB skb)", min=65,
                  max=65536), _DIRECTION),
))

