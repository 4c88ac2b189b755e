"""Link faults through a toxiproxy-API proxy: latency (+ jitter), bandwidth, slow close, timeout, reset peer.

This kernel has no netem, so these faults are toxics on a TCP proxy that the link's traffic is routed through:
the harness' own proxy (harness/toxiproxy/, toxiproxy's HTTP API) on the local provider.  A run whose plan holds
one of these kinds gets the proxy and its routes (harness/reference_target.py ``prepare_links`` before the nodes
start, ``route_links`` after); the topology then carries ``link_proxies`` (plain data, below) and a fault adds
its toxics there through ``toxiproxy-python``.

    topology.link_proxies = {"api": "127.0.0.1:PORT",
                             "links": {LINK: {NODE_NAME: {"proxy": NAME, "listen": "h:p", "upstream": "h:p"}}}}

Links, and the node a fault's target selects (the node whose proxy gets the toxics):

- ``client-broker``: the clients' connections to a reference-broker node (target: a broker selector).  One proxy
  per broker node, made after the nodes started; the clients connect to it instead of the node.
- ``broker-kafka``: every Kafka client's connections to Tansu (target: ``kafka``).  The proxy is made before
  Tansu starts; Tansu listens on its own port and advertises the proxy's address, so a Kafka client follows it
  after its first metadata, and the bootstrap address handed out is the proxy's too: the broker nodes' reads and
  writes and the harness' own Kafka reads (the drain's backlog) all cross it.
- ``broker-redis``: every Redis Cluster client's connections to one Redis node (target: a Redis selector, e.g.
  ``redis-master-of:{subscriber}``).  Each node gets a proxy on its own address before it starts and announces
  the proxy's port (``cluster-announce-port``; the cluster bus stays direct: ``cluster-announce-bus-port``), so
  a cluster client following CLUSTER SLOTS / MOVED reaches every node through its proxy: the broker nodes and
  the harness' own reads (snapshots, queue sizes).  A failover or a restart keeps the announced port (the node
  restarts with the same config, the proxy outlives it).

Evidence: round trips on a fresh connection through the proxy before the toxics, while they last and after
heal -- MQTT CONNECT -> CONNACK then PINGREQ -> PINGRESP (client-broker), Kafka ApiVersions requests
(broker-kafka), Redis PINGs (broker-redis): the round trip the fault added, that a timeout silences and a
reset_peer cuts the connection, and that the link answers as before once healed.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from contracts.credentials import PROBE_CLIENT_ID
from faults.base import (
    Check,
    Evidence,
    FaultContext,
    FaultNotApplicable,
    FaultSpec,
    FaultSpecError,
    KindInfo,
    Param,
    register,
)
from faults.selectors import kafka_role_of, parse_selector, resolve_nodes

LINK_ATTRIBUTE = "link_proxies"  # the topology attribute routing.py sets
CLIENT_BROKER, BROKER_KAFKA, BROKER_REDIS = "client-broker", "broker-kafka", "broker-redis"
LINKS = (CLIENT_BROKER, BROKER_KAFKA, BROKER_REDIS)  # the links a run can route through the proxy
# Routed before the nodes start: the node must advertise / announce its proxy's address from its first start.
PREPARED_LINKS = (BROKER_KAFKA, BROKER_REDIS)
# The targets each link's proxies answer to (checked at load: check_spec), as the error names them.
_BROKER_TARGETS = ("broker", "broker-random", "broker-minority", "broker-majority", "broker-holding")
_REDIS_TARGETS = ("redis-master-of", "redis-replica-of", "redis-random-master", "redis-random-replica", "redis-all")
LINK_TARGETS = {
    CLIENT_BROKER: "a broker node: broker:N, broker-random, broker-minority, broker-majority, broker-holding:CLIENT, "
                   "node:broker-N",
    BROKER_KAFKA: "the Kafka broker: kafka (or node:kafka)",
    BROKER_REDIS: "Redis node(s): redis-master-of:CLIENT, redis-replica-of:CLIENT, redis-random-master, "
                  "redis-random-replica, redis-all, node:redis-...",
}
DIRECTIONS = ("both", "upstream", "downstream")  # upstream: client -> server; downstream: server -> client
PROBE_SAMPLES = 5
PROBE_TIMEOUT_S = 5.0
# The added round trip of a latency fault counts as biting from this share of the configured one (jitter,
# a loaded machine); after heal it must be back under this share (or HEAL_SLACK_MS, whichever is larger).
BITE_SHARE, HEAL_SHARE, HEAL_SLACK_MS = 0.5, 0.5, 20.0

_client_lock = threading.Lock()  # toxiproxy-python keeps the API's host and port in a class attribute


def _call(api: str, action):
    """Run ``action(toxiproxy.Toxiproxy())`` against the API at ``api`` ("host:port")."""
    import toxiproxy

    host, _, port = api.rpartition(":")
    with _client_lock:
        server = toxiproxy.Toxiproxy()
        server.update_api_consumer(host, int(port))
        return action(server)


def create_proxy(api: str, name: str, listen: str, upstream: str) -> dict[str, str]:
    """Create a proxy (toxiproxy-python ``Toxiproxy.create``); returns its name, listen and upstream as served."""
    proxy = _call(api, lambda server: server.create(upstream=upstream, name=name, listen=listen))
    return {"proxy": proxy.name, "listen": proxy.listen, "upstream": proxy.upstream}


def proxied_links(faults: Iterable[Any]) -> set[str]:
    """The links a plan's faults (FaultSlot objects or dicts) need routed through the proxy."""
    links = set()
    for fault in faults:
        kind = fault.get("kind") if isinstance(fault, Mapping) else fault.kind
        params = (fault.get("params") if isinstance(fault, Mapping) else fault.params) or {}
        if kind in LINK_KINDS:
            links.add(params.get("link", CLIENT_BROKER))
    return links


def check_spec(kind: str, target: str | None, params: Mapping[str, Any]) -> None:
    """What the schema cannot say, refused at load: a target that is not a node on the fault's link (its proxy
    would not exist).  Raises FaultSpecError (the caller adds the fault id)."""
    if kind not in LINK_KINDS or not target:
        return
    link = params.get("link", CLIENT_BROKER)
    selector = parse_selector(target)
    if selector.how == "node":
        name = selector.arg or ""
        role = "kafka" if kafka_role_of(target) == "kafka" else name.partition("-")[0]
        fits = {CLIENT_BROKER: role not in ("redis", "kafka", "s3"), BROKER_KAFKA: role == "kafka",
                BROKER_REDIS: role == "redis"}[link]
    else:
        fits = {CLIENT_BROKER: selector.how in _BROKER_TARGETS, BROKER_KAFKA: selector.how == "kafka",
                BROKER_REDIS: selector.how in _REDIS_TARGETS}[link]
    if not fits:
        raise FaultSpecError(f"fault kind {kind!r}: target {target!r} is not a node on link {link!r}; a "
                             f"{link} fault targets {LINK_TARGETS[link]} (give it in targets.{kind})")


# --- the round-trip probes -----------------------------------------------------------------------------------

def _connect_packet(client_id: str) -> bytes:
    """An MQTT 3.1.1 CONNECT, clean session, keep-alive 60 s (§3.1)."""
    name = client_id.encode()
    variable = b"\x00\x04MQTT\x04\x02\x00\x3c" + len(name).to_bytes(2, "big") + name
    return bytes([0x10, len(variable)]) + variable


def _read_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            break
        data += chunk
    return data


def api_versions_request(correlation_id: int, client_id: str) -> bytes:
    """A Kafka ApiVersions v0 request (api key 18; request header v1: key, version, correlation id, client
    id), size-prefixed.  v0: every Kafka broker answers it, before any other request, with no body to send."""
    name = client_id.encode()
    body = (18).to_bytes(2, "big") + (0).to_bytes(2, "big") + correlation_id.to_bytes(4, "big") + \
        len(name).to_bytes(2, "big") + name
    return len(body).to_bytes(4, "big") + body


class _Protocol:
    """One request -> reply exchange of a link's protocol on an open socket: ``first`` once (its reply code,
    None when the link closed), then ``again`` (True when the reply is the right one)."""

    name = ""

    def first(self, sock: socket.socket, client_id: str) -> int | None:
        return 0 if self.again(sock, 0) else None

    def again(self, sock: socket.socket, index: int) -> bool:
        raise NotImplementedError

    bye = b""


class _Mqtt(_Protocol):
    name, bye = "mqtt", b"\xe0\x00"  # DISCONNECT

    def first(self, sock: socket.socket, client_id: str) -> int | None:
        sock.sendall(_connect_packet(client_id))
        connack = _read_exactly(sock, 4)
        return connack[3] if len(connack) == 4 else None

    def again(self, sock: socket.socket, index: int) -> bool:
        sock.sendall(b"\xc0\x00")  # PINGREQ -> PINGRESP
        return _read_exactly(sock, 2) == b"\xd0\x00"


class _Kafka(_Protocol):
    name = "kafka"

    def __init__(self) -> None:
        self.client_id = PROBE_CLIENT_ID

    def first(self, sock: socket.socket, client_id: str) -> int | None:
        self.client_id = client_id
        return 0 if self.again(sock, 0) else None

    def again(self, sock: socket.socket, index: int) -> bool:
        correlation = index + 1
        sock.sendall(api_versions_request(correlation, self.client_id))
        size = _read_exactly(sock, 4)
        if len(size) < 4:
            return False
        reply = _read_exactly(sock, int.from_bytes(size, "big"))
        return len(reply) >= 6 and int.from_bytes(reply[:4], "big") == correlation  # then error code, versions


class _Redis(_Protocol):
    name = "redis"

    def again(self, sock: socket.socket, index: int) -> bool:
        sock.sendall(b"*1\r\n$4\r\nPING\r\n")
        return _read_exactly(sock, 7) == b"+PONG\r\n"


PROTOCOLS = {CLIENT_BROKER: _Mqtt, BROKER_KAFKA: _Kafka, BROKER_REDIS: _Redis}  # each link's probe


def round_trips(link: str, host: str, port: int, client_id: str, samples: int = PROBE_SAMPLES,
                timeout_s: float = PROBE_TIMEOUT_S, hold_s: float = 0.0) -> dict[str, Any]:
    """Round trips on one fresh connection through the link's protocol: the first exchange (MQTT CONNECT ->
    CONNACK, else the first request), then ``samples`` more (PINGREQ -> PINGRESP, ApiVersions, PING); then
    (``hold_s`` > 0) the connection is held that long, to see whether something ends it.
    ``answered``: the first exchange's reply came; ``ended``: "reset" / "closed" / "silent" / "refused" / ""."""
    protocol = PROTOCOLS[link]()
    result: dict[str, Any] = {"address": f"{host}:{port}", "protocol": protocol.name, "answered": False,
                              "connack_code": None, "connect_ms": None, "ping_ms": [], "ended": "", "error": ""}
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as error:
        result.update(ended="refused", error=f"{type(error).__name__}: {error}")
        return result
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        mark = time.monotonic()
        code = protocol.first(sock, client_id)
        if code is None:
            result["ended"] = "closed"
            return result
        result.update(answered=True, connect_ms=round((time.monotonic() - mark) * 1000, 3))
        if protocol.name == "mqtt":
            result["connack_code"] = code
        if code != 0:
            return result
        for index in range(1, samples + 1):
            mark = time.monotonic()
            if not protocol.again(sock, index):
                result["ended"] = "closed"
                return result
            result["ping_ms"].append(round((time.monotonic() - mark) * 1000, 3))
        if hold_s > 0:
            sock.settimeout(hold_s)
            try:
                if not sock.recv(1):
                    result["ended"] = "closed"
                    return result
            except TimeoutError:
                pass  # held open: nothing ended it
        if protocol.bye:
            sock.sendall(protocol.bye)
    except TimeoutError:
        result["ended"] = "silent"
    except ConnectionResetError as error:
        result.update(ended="reset", error=str(error))
    except OSError as error:
        result.update(ended="closed", error=f"{type(error).__name__}: {error}")
    finally:
        sock.close()
    return result


def round_trip_ms(probe: Mapping[str, Any]) -> float | None:
    """The probe's round trip: the median PINGREQ round trip, else the CONNECT's."""
    if probe["ping_ms"]:
        return float(statistics.median(probe["ping_ms"]))
    return probe["connect_ms"]


# --- the faults ------------------------------------------------------------------------------------------------

class LinkFault:
    """One toxic per stream the direction names, on the proxy of each target node's link."""

    def __init__(self, spec: FaultSpec, toxic_type: str) -> None:
        self.spec = spec
        self.toxic_type = toxic_type
        self.installed: list[tuple[str, str, str, str]] = []  # (node, proxy, toxic name, listen)
        self.before: dict[str, float | None] = {}

    @property
    def streams(self) -> tuple[str, ...]:
        direction = self.spec.params["direction"]
        return ("upstream", "downstream") if direction == "both" else (direction,)

    def attributes(self) -> dict[str, int]:
        params = self.spec.params
        return {"latency": {"latency": params.get("latency_ms", 0), "jitter": params.get("jitter_ms", 0)},
                "bandwidth": {"rate": params.get("rate_kbps", 0)},
                "slow_close": {"delay": params.get("delay_ms", 0)},
                "timeout": {"timeout": params.get("timeout_ms", 0)},
                "reset_peer": {"timeout": params.get("timeout_ms", 0)}}[self.toxic_type]

    def expected_added_ms(self) -> float:
        """The round trip a latency fault adds: its latency once per delayed stream."""
        return float(self.spec.params.get("latency_ms", 0) * len(self.streams)) if self.toxic_type == "latency" else 0.0

    def _routes(self, ctx: FaultContext) -> tuple[str, dict[str, dict[str, str]]]:
        where = f"fault {self.spec.id} ({self.spec.kind})"
        routed = getattr(ctx.topology, LINK_ATTRIBUTE, None)
        link = self.spec.params["link"]
        if not routed or link not in routed.get("links", {}):
            raise FaultNotApplicable(f"{where}: link {link!r} is not routed through a proxy in this run (the "
                                     "reference target routes it when the plan holds a link fault; provider "
                                     "and target must support it: faults/catalog.py PROVIDER_GAPS)")
        routes = routed["links"][link]
        nodes = resolve_nodes(ctx.topology, self.spec.target, ctx.rng_for(self.spec.id), ctx.broker_key_prefix)
        chosen = {}
        for node in nodes:
            if node.name not in routes:
                raise FaultNotApplicable(f"{where}: node {node.name!r} has no proxy on link {link!r}; proxied: "
                                         f"{', '.join(sorted(routes))}")
            chosen[node.name] = routes[node.name]
        return routed["api"], chosen

    def _probe(self, listen: str, stage: str) -> dict[str, Any]:
        host, _, port = listen.rpartition(":")
        wait, hold = PROBE_TIMEOUT_S, 0.0
        if self.toxic_type in ("timeout", "reset_peer") and stage == "during":
            wait = min(PROBE_TIMEOUT_S, self.spec.params["timeout_ms"] / 1000 + 1.5)
            hold = wait if self.toxic_type == "reset_peer" else 0.0  # until the reset comes
        return round_trips(self.spec.params["link"], host, int(port), f"{PROBE_CLIENT_ID}-{self.spec.id}-{stage}",
                           timeout_s=wait, hold_s=hold)

    def apply(self, ctx: FaultContext) -> Evidence:
        api, routes = self._routes(ctx)
        self.api = api
        before = {name: self._probe(route["listen"], "before") for name, route in routes.items()}
        self.before = {name: round_trip_ms(probe) for name, probe in before.items()}
        toxicity = self.spec.params["toxicity"]
        for name, route in routes.items():
            for stream in self.streams:
                toxic = f"ordeal_{self.spec.id}_{stream}"
                _call(api, lambda server, route=route, stream=stream, toxic=toxic: server.get_proxy(route["proxy"])
                      .add_toxic(name=toxic, type=self.toxic_type, stream=stream, toxicity=toxicity,
                                 attributes=self.attributes()))
                self.installed.append((name, route["proxy"], toxic, route["listen"]))
        listed = self._listed()
        checks = [Check("toxics installed", {"api": api, "toxics": listed, "routes": routes},
                        len(listed) == len(self.installed))]
        for name, route in routes.items():
            during = self._probe(route["listen"], "during")
            checks.append(self._bite_check(name, before[name], during, toxicity))
        return Evidence(tuple(checks))

    def _listed(self) -> list[dict[str, Any]]:
        ours = {toxic for _node, _proxy, toxic, _listen in self.installed}
        found = []
        for proxy in sorted({proxy for _node, proxy, _toxic, _listen in self.installed}):
            toxics = _call(self.api, lambda server, proxy=proxy: server.get_proxy(proxy).toxics())
            found += [{"proxy": proxy, **vars(toxic)} for name, toxic in toxics.items() if name in ours]
        return found

    def _bite_check(self, node: str, before: dict[str, Any], during: dict[str, Any], toxicity: float) -> Check:
        base, now = round_trip_ms(before), round_trip_ms(during)
        observed: dict[str, Any] = {"node": node, "before": before, "during": during, "before_ms": base,
                                    "during_ms": now, "toxicity": toxicity}
        if self.toxic_type == "latency":
            expected = self.expected_added_ms()
            added = None if base is None or now is None else round(now - base, 3)
            observed.update(added_ms=added, expected_added_ms=expected, bite_share=BITE_SHARE)
            ok = added is not None and added >= BITE_SHARE * expected
            return Check("added round trip", observed, ok if toxicity >= 1 else base is not None)
        if self.toxic_type == "timeout":
            return Check("link silent", observed, not during["answered"] if toxicity >= 1 else True)
        if self.toxic_type == "reset_peer":
            cut = during["ended"] in ("reset", "closed")
            return Check("connection cut", observed, cut if toxicity >= 1 else True)
        # bandwidth, slow_close: a small probe is not slowed by a rate limit nor by a delayed close; the round
        # trips are recorded, the bite is the installed toxic.
        added = None if base is None or now is None else round(now - base, 3)
        observed["added_ms"] = added
        return Check("round trip during the fault", observed, True)

    def heal(self, ctx: FaultContext) -> Evidence:
        if not self.installed:
            return Evidence.of(Check("nothing installed", {"fault": self.spec.id}, True))
        errors = []
        for _node, proxy, toxic, _listen in self.installed:
            try:
                _call(self.api, lambda server, proxy=proxy, toxic=toxic: server.get_proxy(proxy).destroy_toxic(toxic))
            except Exception as error:  # noqa: BLE001 - every toxic is tried; the failure is evidence
                errors.append(f"{proxy}/{toxic}: {type(error).__name__}: {error}")
        left = self._listed()
        checks = [Check("toxics removed", {"left": left, "errors": errors}, not left and not errors)]
        for node, listen in sorted({(node, listen) for node, _proxy, _toxic, listen in self.installed}):
            after = self._probe(listen, "after")
            base = self.before.get(node)
            now = round_trip_ms(after)
            slack = max(HEAL_SHARE * self.expected_added_ms(), HEAL_SLACK_MS)
            extra = None if base is None or now is None else round(now - base, 3)
            checks.append(Check("round trip back", {"node": node, "after": after, "before_ms": base,
                                                    "after_ms": now, "extra_ms": extra, "slack_ms": slack},
                                after["answered"] and (extra is None or extra <= slack)))
        self.installed = []
        return Evidence(tuple(checks))


_COMMON = (
    Param("link", str, CLIENT_BROKER, "the link the proxy sits on: client-broker (clients -> a broker node), "
          "broker-kafka (Kafka clients -> Tansu), broker-redis (Redis Cluster clients -> a Redis node)",
          choices=LINKS),
    Param("direction", str, "both", "upstream (client -> server), downstream (server -> client) or both",
          choices=DIRECTIONS),
    Param("toxicity", float, 1.0, "the share of connections the toxic affects (each drawn once)", min=0.0, max=1.0),
)
_MS_MAX = 600_000


def _register(name: str, toxic_type: str, description: str, params: tuple[Param, ...]) -> None:
    register(KindInfo(name=name, category="network", target="node", description=description,
                      params=params + _COMMON, factory=lambda spec: LinkFault(spec, toxic_type)))


_register("link_latency", "latency",
          "delay every chunk on a link by latency_ms +- jitter_ms (toxiproxy latency toxic); heal removes it",
          (Param("latency_ms", int, 200, "added delay per direction, ms", min=1, max=_MS_MAX),
           Param("jitter_ms", int, 0, "uniform +- jitter around the delay, ms", min=0, max=_MS_MAX)))
_register("link_bandwidth", "bandwidth", "limit a link to rate_kbps KB/s (toxiproxy bandwidth toxic)",
          (Param("rate_kbps", int, 100, "rate in KB/s", min=1, max=10_000_000),))
_register("link_slow_close", "slow_close", "delay the close of a link's connections by delay_ms (toxiproxy "
          "slow_close toxic)", (Param("delay_ms", int, 1000, "delay of the close, ms", min=0, max=_MS_MAX),))
_register("link_timeout", "timeout", "stop all data on a link and close its connections after timeout_ms "
          "(0: never close; toxiproxy timeout toxic)",
          (Param("timeout_ms", int, 0, "close after, ms (0: keep open, drop data)", min=0, max=_MS_MAX),))
_register("link_reset_peer", "reset_peer", "reset (TCP RST) a link's connections timeout_ms after they meet "
          "the fault (toxiproxy reset_peer toxic)",
          (Param("timeout_ms", int, 0, "reset after, ms", min=0, max=_MS_MAX),))

LINK_KINDS = ("link_latency", "link_bandwidth", "link_slow_close", "link_timeout", "link_reset_peer")
