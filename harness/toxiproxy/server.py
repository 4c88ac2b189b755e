"""A TCP proxy serving the subset of toxiproxy's HTTP API that Ordeal uses (Shopify/toxiproxy, API of 2.x).

There is no toxiproxy binary on these machines and this kernel has no netem, so latency, jitter, bandwidth,
slow close, timeout and reset-peer faults are played by this proxy in the harness: one asyncio process
(``python -m harness.toxiproxy --listen 127.0.0.1:0``), loopback only, driven over the same HTTP API as the
real toxiproxy, so ``toxiproxy-python`` (or a real toxiproxy on the containers provider) can stand behind it.

One addition to toxiproxy's behaviour: a proxy listening on its upstream's own host connects to the upstream
from that host (the broker -> Redis / Kafka links' proxies sit on the node's address: harness/toxiproxy/routing.py),
so that a network fault on an address sees the proxied link as it saw the direct one.

HTTP side: the standard library (asyncio streams, one JSON request per connection, ``Connection: close``).
The API is a dozen JSON routes of a few hundred bytes each; aiohttp is not a dependency of the project, and a
new one for this would be heavier than the forty lines of request parsing below.

API (the subset; paths, status codes and JSON shapes as toxiproxy's api.go):

    GET    /version                          -> 200 text "ordeal-toxiproxy <version>"
    POST   /reset                            -> 204 (every proxy enabled, every toxic removed)
    GET    /proxies                          -> 200 {name: proxy}
    POST   /proxies   {name, listen, upstream, enabled?}   -> 201 proxy | 409 exists | 400 bad
    GET    /proxies/{name}                   -> 200 proxy | 404
    POST   /proxies/{name}  {enabled?, listen?, upstream?} -> 200 proxy (disabling drops every connection)
    PATCH  /proxies/{name}                   (same as POST)
    DELETE /proxies/{name}                   -> 204
    GET    /proxies/{name}/toxics            -> 200 [toxic]
    POST   /proxies/{name}/toxics  {name?, type, stream?, toxicity?, attributes}  -> 200 toxic | 409 | 400
    GET    /proxies/{name}/toxics/{toxic}    -> 200 toxic | 404
    POST   /proxies/{name}/toxics/{toxic}  {attributes?, toxicity?}  -> 200 toxic
    DELETE /proxies/{name}/toxics/{toxic}    -> 204

    proxy = {"name", "listen", "upstream", "enabled", "toxics": [toxic]}
    toxic = {"name", "type", "stream": "upstream"|"downstream", "toxicity": 0..1, "attributes": {...}}
    errors: {"error": message, "status": code}

Toxics (toxiproxy's toxics/*.go semantics; ``upstream`` = client -> server, ``downstream`` = server -> client;
the default name is ``<type>_<stream>``; a connection draws once per toxic whether it is affected, with
probability ``toxicity``; toxics added or changed apply to open connections at once):

    latency     latency, jitter (ms): each chunk delivered latency +- uniform(jitter) after it arrived
                (pipelined: chunks keep their order, a second chunk does not wait for the first's delay)
    bandwidth   rate (KB/s): each chunk takes len/rate to pass, one after another
    slow_close  delay (ms): when the sending side closes, the close reaches the other side delay later
    timeout     timeout (ms): no data passes; the connection is closed after timeout (0: never, data is
                dropped until the toxic is removed)
    reset_peer  timeout (ms): the connection is reset (RST: SO_LINGER 0) after timeout from the toxic's
                start on it; downstream resets the client's socket, upstream the server's

One toxic of Ordeal's own, an addition to toxiproxy's set (faults/process.py ``at_commit``: Tansu killed or
paused while a consumer's offset commit is on its way):

    hold_requests  api_key (int, default 8: OffsetCommit), group_prefix (str, "": any group), held (read only);
                upstream only.  The upstream stream of every connection is read as Kafka requests (4-byte
                big-endian size, then int16 api_key, int16 api_version, int32 correlation id, client id, and
                for the group APIs the group id first in the body: ``parse_kafka_request``); a request with that
                api_key (and a group id starting with group_prefix) is held back, and with it everything after
                it on that connection (the order is kept); the other connections go on until they send one.
                Removing the toxic sends what each connection held on, in order.  ``held`` counts the matching
                requests held so far (all connections); GET also lists the first of them (``held_requests``:
                api_version, correlation_id, client_id, group_id, connection).  Every connection's upstream is
                framed from its first byte, so a toxic added mid-stream knows where each request starts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Any

VERSION = "ordeal-toxiproxy 1.0 (toxiproxy API 2.x subset)"
STREAMS = ("upstream", "downstream")
# type -> {attribute: default}; every attribute a non-negative integer, as in toxiproxy (hold_requests, Ordeal's
# own, also has a string: group_prefix).
TOXIC_TYPES: dict[str, dict[str, int | str]] = {
    "latency": {"latency": 0, "jitter": 0},
    "bandwidth": {"rate": 0},
    "slow_close": {"delay": 0},
    "timeout": {"timeout": 0},
    "reset_peer": {"timeout": 0},
    "hold_requests": {"api_key": 8, "group_prefix": "", "held": 0},
}
READ_ONLY = {"hold_requests": ("held",)}  # attributes the proxy reports and a request may not set
UPSTREAM_ONLY = ("hold_requests",)  # it parses Kafka requests: the client -> server stream
HELD_LISTED = 20  # hold_requests: how many held requests GET lists (``held`` counts them all)
CHUNK = 32 * 1024
LOOPBACK_PREFIX = "127."
_SERIALS = itertools.count(1)


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# --- Kafka request framing (the hold_requests toxic) -----------------------------------------------------------

# The group APIs whose request body starts with the group id, and the version from which each is "flexible"
# (KIP-482: request header v2 with tagged fields, compact strings): OffsetCommit, OffsetFetch (v8+: a list of
# groups instead), JoinGroup, Heartbeat, LeaveGroup, SyncGroup.
GROUP_FIRST_FLEXIBLE_FROM = {8: 8, 9: 6, 11: 6, 12: 4, 13: 4, 14: 4}
GROUP_FIRST_UNTIL = {9: 7}  # OffsetFetch v8+ carries a list of groups: no single group id first
HEAD_MAX = 4 + 1024  # bytes of a request's beginning kept to parse its header and group id


@dataclass(frozen=True)
class KafkaRequest:
    """The beginning of one Kafka request as far as the bytes seen allow (None: not seen yet)."""

    size: int  # the 4-byte length prefix: bytes after it
    api_key: int
    api_version: int | None = None
    correlation_id: int | None = None
    client_id: str | None = None
    group_id: str | None = None
    group_unknown: bool = False  # this API / version has no group id first, or it cannot be parsed


def _uvarint(data: bytes, at: int) -> tuple[int, int] | None:
    value = shift = 0
    while at < len(data):
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
        if shift > 35:
            return None
    return None


def parse_kafka_request(head: bytes) -> KafkaRequest | None:
    """Parse what ``head`` (a request's first bytes, size prefix included) holds: None before the api key.
    Header v1 (api_key, api_version, correlation_id, nullable int16 client id), v2 for flexible versions (then
    tagged fields); the group id of the group APIs (int16 string, or a compact string when flexible)."""
    if len(head) < 6:
        return None
    size = int.from_bytes(head[0:4], "big")
    api_key = int.from_bytes(head[4:6], "big", signed=True)
    if len(head) < 12:
        return KafkaRequest(size, api_key)
    version = int.from_bytes(head[6:8], "big", signed=True)
    correlation = int.from_bytes(head[8:12], "big", signed=True)
    partial = KafkaRequest(size, api_key, version, correlation)
    if len(head) < 14:
        return partial
    length = int.from_bytes(head[12:14], "big", signed=True)
    at = 14 + max(length, 0)
    if len(head) < at:
        return partial
    client_id = head[14:at].decode("utf-8", "replace") if length >= 0 else None
    named = KafkaRequest(size, api_key, version, correlation, client_id)
    flexible_from = GROUP_FIRST_FLEXIBLE_FROM.get(api_key)
    if flexible_from is None or version > GROUP_FIRST_UNTIL.get(api_key, version) or version < 0:
        return KafkaRequest(size, api_key, version, correlation, client_id, group_unknown=True)
    if version >= flexible_from:
        tags = _uvarint(head, at)  # the header's tagged fields: count, then (tag, size, data) each
        if tags is None:
            return named
        count, at = tags
        for _ in range(count):
            tag = _uvarint(head, at)
            sized = _uvarint(head, tag[1]) if tag else None
            if sized is None:
                return named
            at = sized[1] + sized[0]
        compact = _uvarint(head, at)
        if compact is None:
            return named
        length, at = compact[0] - 1, compact[1]
    else:
        if len(head) < at + 2:
            return named
        length, at = int.from_bytes(head[at:at + 2], "big", signed=True), at + 2
    if length < 0:
        return KafkaRequest(size, api_key, version, correlation, client_id, group_unknown=True)
    if len(head) < at + length:
        return named
    return KafkaRequest(size, api_key, version, correlation, client_id, head[at:at + length].decode("utf-8", "replace"))


class KafkaRequestHold:
    """One connection's upstream as Kafka requests: which bytes pass and which are held.

    ``feed(data, wants)`` returns the bytes to send on now and the requests newly held (with what ``wants``
    said of each: the toxic that holds it), each once all of it (or HEAD_MAX of it) is held.  ``wants(request, complete)`` -> a truthy value (hold it), False
    (pass it) or None (more of its bytes are needed to say); ``wants=None``: nothing is held, the framing is
    only followed.  A request's bytes wait until it is decided; once one is held, every byte after it on the
    connection is held too (``holding``), and the requests among them that ``wants`` holds are counted as held.
    ``release()`` returns everything held and lets the stream pass again.  Pure: no I/O, any chunking."""

    def __init__(self) -> None:
        self.holding = False
        self.held = bytearray()
        self._head = bytearray()  # the current request's first bytes (up to HEAD_MAX)
        self._seen = 0  # bytes of the current request so far, size prefix included
        self._total: int | None = None  # its length with the prefix, once the prefix is in
        self._decided: Any = None  # None: not yet; False: passes; else held (what wants said)
        self._pending = bytearray()  # its bytes while undecided (not holding)
        self._reported = False  # the current request, held, is in ``feed``'s newly held

    def feed(self, data: bytes, wants: Any = None) -> tuple[bytes, list[tuple[KafkaRequest, Any]]]:
        out = bytearray()
        newly: list[tuple[KafkaRequest, Any]] = []
        at = 0
        while at < len(data):
            if self._total is None:
                take = data[at:at + 4 - self._seen]
            else:
                take = data[at:at + self._total - self._seen]
            at += len(take)
            self._seen += len(take)
            if len(self._head) < HEAD_MAX:
                self._head += take[:HEAD_MAX - len(self._head)]
            if self.holding:
                self.held += take
            elif self._decided is False:
                out += take
            else:
                self._pending += take
            if self._total is None and self._seen >= 4:
                self._total = 4 + int.from_bytes(self._head[:4], "big")
            complete = self._total is not None and self._seen >= self._total
            if self._decided is None:
                self._decide(wants, complete, out)
            if self._decided not in (None, False) and not self._reported and (complete or len(self._head) >= HEAD_MAX):
                self._reported = True  # reported once its header is in: correlation id, client and group ids
                newly.append((parse_kafka_request(bytes(self._head)), self._decided))
            if complete:
                self._reported = False
                self._head.clear()
                self._seen, self._total, self._decided = 0, None, None
        return bytes(out), newly

    def _decide(self, wants: Any, complete: bool, out: bytearray) -> None:
        request = parse_kafka_request(bytes(self._head))
        if wants is None:
            decision = False
        elif request is None:
            decision = False if complete else None
        else:
            decision = wants(request, complete or len(self._head) >= HEAD_MAX)
            if decision is None and (complete or len(self._head) >= HEAD_MAX):
                decision = False
        if decision is None:
            return
        self._decided = decision
        if decision is not False:
            if not self.holding:
                self.holding = True
                self.held += self._pending
                self._pending.clear()
        if not self.holding:
            out += self._pending
            self._pending.clear()

    def release(self) -> bytes:
        """Everything held, in order; the stream passes from here on (the rest of a request begun is sent)."""
        data = bytes(self.held)
        self.held.clear()
        if self.holding and self._seen:
            self._decided = False  # the rest of the request under way passes
        self.holding = False
        return data


@dataclass
class HoldLog:
    """What a hold_requests toxic held, over every connection (kept across updates of the toxic)."""

    count: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)  # the first HELD_LISTED

    def add(self, request: KafkaRequest, connection: int) -> None:
        self.count += 1
        if len(self.requests) < HELD_LISTED:
            self.requests.append({"api_key": request.api_key, "api_version": request.api_version,
                                  "correlation_id": request.correlation_id, "client_id": request.client_id,
                                  "group_id": request.group_id, "connection": connection})


@dataclass
class Toxic:
    name: str
    type: str
    stream: str
    toxicity: float
    attributes: dict[str, Any]
    hold: HoldLog = field(default_factory=HoldLog, compare=False)

    def to_dict(self) -> dict[str, Any]:
        result = {"name": self.name, "type": self.type, "stream": self.stream, "toxicity": self.toxicity,
                  "attributes": dict(self.attributes)}
        if self.type == "hold_requests":
            result["attributes"]["held"] = self.hold.count
            result["held_requests"] = [dict(request) for request in self.hold.requests]
        return result

    def wants(self, request: KafkaRequest, complete: bool) -> bool | None:
        """hold_requests: whether this toxic holds ``request`` (None: more of its bytes are needed to say)."""
        if request.api_key != self.attributes["api_key"]:
            return False
        prefix = self.attributes["group_prefix"]
        if not prefix:
            return True
        if request.group_id is None:
            return False if complete or request.group_unknown else None
        return request.group_id.startswith(prefix)


def parse_toxic(body: dict[str, Any], existing: Toxic | None = None) -> Toxic:
    """A toxic from an add (``existing`` None) or update request body; ApiError 400 when it is bad."""
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    kind = existing.type if existing else body.get("type")
    if kind not in TOXIC_TYPES:
        raise ApiError(400, f"invalid toxic type {kind!r}; allowed: {', '.join(TOXIC_TYPES)}")
    stream = existing.stream if existing else body.get("stream", "downstream")
    if stream not in STREAMS:
        raise ApiError(400, f"invalid stream {stream!r}; allowed: {', '.join(STREAMS)}")
    if kind in UPSTREAM_ONLY and stream != "upstream":
        raise ApiError(400, f"toxic type {kind!r} reads the client's requests: stream must be 'upstream'")
    toxicity = body.get("toxicity", existing.toxicity if existing else 1.0)
    if isinstance(toxicity, bool) or not isinstance(toxicity, (int, float)) or not 0 <= toxicity <= 1:
        raise ApiError(400, f"toxicity must be a number in [0, 1], got {toxicity!r}")
    attributes = dict(existing.attributes if existing else TOXIC_TYPES[kind])
    given = body.get("attributes") or {}
    if not isinstance(given, dict):
        raise ApiError(400, "attributes must be a JSON object")
    for key, value in given.items():
        if key not in TOXIC_TYPES[kind]:
            raise ApiError(400, f"toxic type {kind!r} has no attribute {key!r}; allowed: "
                                f"{', '.join(TOXIC_TYPES[kind])}")
        if key in READ_ONLY.get(kind, ()):
            if value in (0, existing.hold.count if existing else 0):
                continue  # as GET reported it: a client sending the toxic back
            raise ApiError(400, f"attribute {key!r} of toxic type {kind!r} is reported by the proxy, not set")
        if isinstance(TOXIC_TYPES[kind][key], str):
            if not isinstance(value, str):
                raise ApiError(400, f"attribute {key!r} must be a string, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ApiError(400, f"attribute {key!r} must be a non-negative integer, got {value!r}")
        attributes[key] = value
    name = existing.name if existing else body.get("name") or f"{kind}_{stream}"
    if not isinstance(name, str):
        raise ApiError(400, f"toxic name must be a string, got {name!r}")
    return Toxic(name, kind, stream, float(toxicity), attributes, existing.hold if existing else HoldLog())


def split_address(text: Any, what: str) -> tuple[str, int]:
    if not isinstance(text, str) or ":" not in text:
        raise ApiError(400, f"{what} must be 'host:port', got {text!r}")
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if host == "localhost":
        host = "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        raise ApiError(400, f"{what}: port must be a number, got {text!r}") from None
    return host, number


class Connection:
    """One client connection and its upstream: two pumps, the toxics' state for this connection."""

    def __init__(self, proxy: Proxy, client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 server: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.proxy = proxy
        self.client, self.server = client, server
        self.rng = random.Random()
        self.draws: dict[tuple[str, int], bool] = {}  # (toxic name, id) -> affected
        self.timers: dict[tuple[str, int], asyncio.Task] = {}
        self.closed = False
        self.tasks: list[asyncio.Task] = []
        self.serial = next(_SERIALS)  # names the connection in a hold_requests toxic's held_requests
        self.requests = KafkaRequestHold()  # the upstream read as Kafka requests (only a hold_requests toxic acts)
        self.queues: dict[str, asyncio.Queue] = {}  # stream -> its delivery queue (_pump)
        self.last_at: dict[str, float] = dict.fromkeys(STREAMS, 0.0)  # when a stream's last chunk is delivered

    def affected(self, toxic: Toxic) -> bool:
        key = (toxic.name, id(toxic))
        if key not in self.draws:
            self.draws[key] = toxic.toxicity >= 1 or self.rng.random() < toxic.toxicity
        return self.draws[key]

    def active(self, stream: str) -> list[Toxic]:
        return [t for t in self.proxy.toxics.values() if t.stream == stream and self.affected(t)]

    def toxics_changed(self) -> None:
        """Start the timers of timeout / reset_peer toxics new to this connection, drop those removed; send on
        what a removed hold_requests toxic held (when none is left on this connection)."""
        live = {(t.name, id(t)): t for t in self.proxy.toxics.values()}
        if self.requests.holding and not any(t.type == "hold_requests" for t in self.active("upstream")):
            data = self.requests.release()
            queue = self.queues.get("upstream")
            if data and queue is not None and not self.closed:
                self.last_at["upstream"] = at = max(time.monotonic(), self.last_at["upstream"])
                queue.put_nowait((at, data))
        for key in [key for key in self.timers if key not in live]:
            self.timers.pop(key).cancel()
        for key, toxic in live.items():
            if toxic.type in ("timeout", "reset_peer") and key not in self.timers and self.affected(toxic):
                self.timers[key] = asyncio.ensure_future(self._timer(toxic))

    async def _timer(self, toxic: Toxic) -> None:
        wait_ms = toxic.attributes["timeout"]
        if toxic.type == "timeout" and wait_ms == 0:
            return  # data is dropped while it lasts; the connection stays open
        await asyncio.sleep(wait_ms / 1000)
        if toxic.type == "reset_peer":
            self.close(reset="client" if toxic.stream == "downstream" else "server")
        else:
            self.close()

    def start(self) -> None:
        self.tasks = [asyncio.ensure_future(self._pump(self.client[0], self.server[1], "upstream")),
                      asyncio.ensure_future(self._pump(self.server[0], self.client[1], "downstream"))]
        self.toxics_changed()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stream: str) -> None:
        queue: asyncio.Queue = asyncio.Queue()
        self.queues[stream] = queue
        deliver = asyncio.ensure_future(self._deliver(queue, writer, stream))
        try:
            while not self.closed:
                try:
                    data = await reader.read(CHUNK)
                except (ConnectionError, OSError):
                    data = b""
                if not data:
                    break
                arrived = time.monotonic()
                toxics = self.active(stream)
                if stream == "upstream":  # framed from the first byte, whether a hold_requests toxic acts or not
                    data = self._hold(data, toxics)
                if any(t.type == "timeout" for t in toxics):
                    continue  # nothing passes while a timeout toxic lasts
                if not data:
                    continue  # held (hold_requests)
                delay = 0.0
                for toxic in toxics:
                    if toxic.type == "latency":
                        jitter = toxic.attributes["jitter"]
                        delay += max(0.0, toxic.attributes["latency"] + self.rng.uniform(-jitter, jitter)) / 1000
                at = max(arrived + delay, self.last_at[stream])
                for toxic in toxics:
                    if toxic.type == "bandwidth" and toxic.attributes["rate"] > 0:
                        at += len(data) / (toxic.attributes["rate"] * 1000)
                self.last_at[stream] = at
                await queue.put((at, data))
        finally:
            await queue.put(None)  # end of stream
            with contextlib.suppress(asyncio.CancelledError):
                await deliver

    def _hold(self, data: bytes, toxics: list[Toxic]) -> bytes:
        """The upstream bytes that pass now (hold_requests: a matching request and what follows it are held)."""
        holds = [t for t in toxics if t.type == "hold_requests"]

        def wants(request: KafkaRequest, complete: bool) -> Any:
            answers = [(toxic, toxic.wants(request, complete)) for toxic in holds]
            for toxic, answer in answers:
                if answer:
                    return toxic
            return None if any(answer is None for _, answer in answers) else False

        passed, newly = self.requests.feed(data, wants if holds else None)
        for request, toxic in newly:
            toxic.hold.add(request, self.serial)
        return passed

    async def _deliver(self, queue: asyncio.Queue, writer: asyncio.StreamWriter, stream: str) -> None:
        while True:
            item = await queue.get()
            if item is None:
                break
            at, data = item
            wait = at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if self.closed:
                return
            try:
                writer.write(data)
                await writer.drain()
            except (ConnectionError, OSError):
                self.close()
                return
        slow = [t.attributes["delay"] for t in self.active(stream) if t.type == "slow_close"]
        if slow:
            await asyncio.sleep(sum(slow) / 1000)
        self.close()

    def close(self, reset: str = "") -> None:
        if self.closed:
            return
        self.closed = True
        for timer in self.timers.values():
            timer.cancel()
        for side, (_reader, writer) in (("client", self.client), ("server", self.server)):
            if side == reset:
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
            else:
                writer.close()
        self.proxy.connections.discard(self)


@dataclass
class Proxy:
    name: str
    listen: str
    upstream: str
    enabled: bool = True
    toxics: dict[str, Toxic] = field(default_factory=dict)
    server: asyncio.base_events.Server | None = None
    connections: set[Connection] = field(default_factory=set)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "listen": self.listen, "upstream": self.upstream, "enabled": self.enabled,
                "toxics": [toxic.to_dict() for toxic in self.toxics.values()]}

    async def start(self) -> None:
        host, port = split_address(self.listen, "listen")
        if not host.startswith(LOOPBACK_PREFIX):
            raise ApiError(400, f"listen {self.listen!r}: this proxy listens on loopback (127.x.y.z) only")
        try:
            self.server = await asyncio.start_server(self._accept, host, port, reuse_address=True)
        except OSError as error:
            raise ApiError(500, f"proxy {self.name}: cannot listen on {self.listen}: {error}") from None
        bound = self.server.sockets[0].getsockname()
        self.listen = f"{bound[0]}:{bound[1]}"
        self.enabled = True

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None
        for connection in list(self.connections):
            connection.close()
        self.enabled = False

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = split_address(self.upstream, "upstream")
        # A proxy on its upstream's own address (the broker -> Redis / Kafka links: harness/toxiproxy/routing.py)
        # connects from that address, as the node's own loopback: a network fault on the node's address then
        # cuts the proxied link as it cut the direct one, and one on the clients' 127.0.0.1 does not.
        source = (host, 0) if host == split_address(self.listen, "listen")[0] else None
        try:
            server = await asyncio.open_connection(host, port, local_addr=source)
        except OSError:
            writer.close()  # as toxiproxy: the client's connection is closed when the upstream refuses
            return
        connection = Connection(self, (reader, writer), server)
        self.connections.add(connection)
        connection.start()

    def toxics_changed(self) -> None:
        for connection in list(self.connections):
            connection.toxics_changed()


class Api:
    def __init__(self) -> None:
        self.proxies: dict[str, Proxy] = {}

    async def handle(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        parts = [part for part in path.split("?")[0].split("/") if part]
        if parts == ["version"] and method == "GET":
            return 200, VERSION
        if parts == ["reset"] and method == "POST":
            for proxy in self.proxies.values():
                proxy.toxics.clear()
                if not proxy.enabled:
                    await proxy.start()
                proxy.toxics_changed()
            return 204, None
        if not parts or parts[0] != "proxies":
            raise ApiError(404, f"no route {method} {path}")
        if len(parts) == 1:
            if method == "GET":
                return 200, {name: proxy.to_dict() for name, proxy in self.proxies.items()}
            if method == "POST":
                return 201, await self.create(body)
        proxy = self.proxies.get(parts[1]) if len(parts) > 1 else None
        if proxy is None:
            raise ApiError(404, "proxy not found")
        if len(parts) == 2:
            if method == "GET":
                return 200, proxy.to_dict()
            if method in ("POST", "PATCH"):
                return 200, await self.update(proxy, body)
            if method == "DELETE":
                await proxy.stop()
                del self.proxies[proxy.name]
                return 204, None
        if len(parts) >= 3 and parts[2] == "toxics":
            if len(parts) == 3:
                if method == "GET":
                    return 200, [toxic.to_dict() for toxic in proxy.toxics.values()]
                if method == "POST":
                    toxic = parse_toxic(body)
                    if toxic.name in proxy.toxics:
                        raise ApiError(409, "toxic already exists")
                    proxy.toxics[toxic.name] = toxic
                    proxy.toxics_changed()
                    return 200, toxic.to_dict()
            elif len(parts) == 4:
                toxic = proxy.toxics.get(parts[3])
                if toxic is None:
                    raise ApiError(404, "toxic not found")
                if method == "GET":
                    return 200, toxic.to_dict()
                if method in ("POST", "PATCH"):
                    proxy.toxics[toxic.name] = parse_toxic(body, existing=toxic)
                    proxy.toxics_changed()
                    return 200, proxy.toxics[toxic.name].to_dict()
                if method == "DELETE":
                    del proxy.toxics[toxic.name]
                    proxy.toxics_changed()
                    return 204, None
        raise ApiError(405, f"method {method} not allowed on {path}")

    async def create(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise ApiError(400, "missing required field: name")
        if name in self.proxies:
            raise ApiError(409, "proxy already exists")
        split_address(body.get("upstream"), "upstream")
        proxy = Proxy(name, body.get("listen") or "127.0.0.1:0", body["upstream"])
        if body.get("enabled", True):
            await proxy.start()
        else:
            proxy.enabled = False
        self.proxies[name] = proxy
        return proxy.to_dict()

    async def update(self, proxy: Proxy, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        moved = False
        for key in ("listen", "upstream"):
            if key in body and body[key] != getattr(proxy, key):
                split_address(body[key], key)
                setattr(proxy, key, body[key])
                moved = True
        enabled = body.get("enabled", proxy.enabled)
        if proxy.enabled and (not enabled or moved):
            await proxy.stop()
        if enabled and not proxy.enabled:
            await proxy.start()
        return proxy.to_dict()


async def serve_http(api: Api, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        request_line = (await reader.readline()).decode("latin-1").strip()
        if not request_line:
            return
        method, path, _version = request_line.split(" ", 2)
        length = 0
        while True:
            line = (await reader.readline()).decode("latin-1").strip()
            if not line:
                break
            key, _, value = line.partition(":")
            if key.strip().lower() == "content-length":
                length = int(value.strip())
        raw = await reader.readexactly(length) if length else b""
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError:
            status, payload = 400, {"error": "bad request body: not JSON", "status": 400}
        else:
            try:
                status, payload = await api.handle(method.upper(), path, body)
            except ApiError as error:
                status, payload = error.status, {"error": str(error), "status": error.status}
        if payload is None:
            data, kind = b"", "text/plain"
        elif isinstance(payload, str):
            data, kind = payload.encode(), "text/plain"
        else:
            data, kind = json.dumps(payload).encode(), "application/json"
        reason = {200: "OK", 201: "Created", 204: "No Content", 400: "Bad Request", 404: "Not Found",
                  405: "Method Not Allowed", 409: "Conflict", 500: "Internal Server Error"}.get(status, "")
        head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\nConnection: close\r\n"
        if status != 204:
            head += f"Content-Length: {len(data)}\r\n"
        writer.write(head.encode() + b"\r\n" + (data if status != 204 else b""))
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, ValueError):
        pass
    finally:
        writer.close()


async def main_async(listen: str) -> None:
    api = Api()
    host, port = split_address(listen, "--listen")
    if not host.startswith(LOOPBACK_PREFIX):
        raise SystemExit(f"--listen {listen!r}: the API listens on loopback (127.x.y.z) only")
    server = await asyncio.start_server(lambda r, w: serve_http(api, r, w), host, port, reuse_address=True)
    bound = server.sockets[0].getsockname()
    print(json.dumps({"api": f"{bound[0]}:{bound[1]}", "version": VERSION}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    server.close()
    for proxy in list(api.proxies.values()):
        await proxy.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.toxiproxy", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:8474", help="the API's address (loopback only)")
    args = parser.parse_args(argv)
    asyncio.run(main_async(args.listen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
